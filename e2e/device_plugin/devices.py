"""What the fake GPU plugin advertises and what a container that is allocated devices gets:
pure functions, no gRPC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RESOURCE = "nvidia.com/gpu"
COUNT_LABEL = "modelpool.dev/fake-gpus"
# Shared mode, as the NVIDIA plugin's time-slicing `replicas` (or the generic device
# plugin's `count`) shares a GPU: each device advertised SHARES times, its memory given to
# every container as MODELPOOL_GPU_MEMORY so the servers on it keep a ledger of it.
SHARES_LABEL = "modelpool.dev/fake-gpu-shares"
MEMORY_LABEL = "modelpool.dev/fake-gpu-memory-mib"
SHARE_SEPARATOR = "::"  # as the NVIDIA plugin names a time-sliced replica: <device>::<n>
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
class Sharing:
    """How a node's devices are advertised: `shares` times each (1: exclusive), each with
    `memory` bytes (None: not told)."""

    shares: int = 1
    memory: int | None = None


EXCLUSIVE = Sharing()


def _whole(labels: Mapping[str, str], label: str, low: int, high: int) -> int | None:
    raw = labels.get(label)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise CountError(f"label {label}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise CountError(f"label {label}={raw!r} is out of range {low}-{high}")
    return value


def sharing(labels: Mapping[str, str]) -> Sharing:
    """The node's sharing from its labels; shares without a memory are an error (the
    servers on a shared device need its memory to keep their ledger)."""
    shares = _whole(labels, SHARES_LABEL, 1, 64) or 1
    mib = _whole(labels, MEMORY_LABEL, 1, 1 << 24)
    if shares > 1 and mib is None:
        raise CountError(f"label {SHARES_LABEL}={shares} needs {MEMORY_LABEL}")
    return Sharing(shares, mib * (1 << 20) if mib is not None else None)


def advertised_ids(count: int, how: Sharing) -> list[str]:
    """The ids the kubelet sees: the device ids, or `<device>::<n>` for each share."""
    if how.shares == 1:
        return device_ids(count)
    return [f"{d}{SHARE_SEPARATOR}{n}" for d in device_ids(count) for n in range(how.shares)]


def physical(advertised: str) -> str:
    """The device an advertised id stands for."""
    return advertised.split(SHARE_SEPARATOR, 1)[0]


def _order(advertised: str) -> tuple[int, int]:
    device, _, share = advertised.partition(SHARE_SEPARATOR)
    return int(device), int(share or 0)


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Allocation:
    envs: Mapping[str, str]
    mounts: Sequence[Mount]


def allocation(ids: Sequence[str], known: Sequence[str],
               how: Sharing = EXCLUSIVE) -> Allocation:
    """What a container allocated `ids` gets; unknown ids are an error (the kubelet only
    asks for devices the plugin listed). Shares of one device name it once."""
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ValueError(f"unknown device ids: {', '.join(unknown)}")
    devices = list(dict.fromkeys(physical(i) for i in ids))
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(devices),
        "MODELPOOL_GPU_LOCK_DIR": CONTAINER_LOCK_DIR,
    }
    if how.memory is not None:
        envs["MODELPOOL_GPU_MEMORY"] = str(how.memory)
    return Allocation(envs=envs, mounts=[Mount(CONTAINER_LOCK_DIR, HOST_LOCK_DIR, False)])


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The devices to prefer: those that must be included, then the lowest free ones."""
    chosen = list(must_include)
    for device in sorted(available, key=_order):
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen[:size]
