"""What the fake GPU plugin advertises and what a container that is allocated devices gets:
pure functions, no gRPC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RESOURCE = "nvidia.com/gpu"
COUNT_LABEL = "modelpool.dev/fake-gpus"
HEALTHY = "Healthy"
# On the node, one lock file per device (created by the plugin); in the container, where
# the fake model server is told to find them.
HOST_LOCK_DIR = "/var/lib/modelpool-fake-gpu/locks"
CONTAINER_LOCK_DIR = "/run/modelpool-gpu-locks"


class CountError(ValueError):
    """The node's label does not say how many devices it has."""


def device_count(labels: Mapping[str, str]) -> int:
    raw = labels.get(COUNT_LABEL)
    if raw is None:
        raise CountError(f"the node has no label {COUNT_LABEL}")
    try:
        count = int(raw)
    except ValueError:
        raise CountError(f"label {COUNT_LABEL}={raw!r} is not a whole number") from None
    if not 0 <= count <= 64:
        raise CountError(f"label {COUNT_LABEL}={raw!r} is out of range 0-64")
    return count


def device_ids(count: int) -> list[str]:
    """Device ids as NVIDIA_VISIBLE_DEVICES names them: indexes from 0."""
    return [str(i) for i in range(count)]


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Allocation:
    envs: Mapping[str, str]
    mounts: Sequence[Mount]


def allocation(ids: Sequence[str], known: Sequence[str]) -> Allocation:
    """What a container allocated `ids` gets; unknown ids are an error (the kubelet only
    asks for devices the plugin listed)."""
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ValueError(f"unknown device ids: {', '.join(unknown)}")
    return Allocation(
        envs={
            "NVIDIA_VISIBLE_DEVICES": ",".join(ids),
            "MODELPOOL_GPU_LOCK_DIR": CONTAINER_LOCK_DIR,
        },
        mounts=[Mount(CONTAINER_LOCK_DIR, HOST_LOCK_DIR, False)],
    )


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The devices to prefer: those that must be included, then the lowest free ones."""
    chosen = list(must_include)
    for device in sorted(available, key=int):
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen[:size]
