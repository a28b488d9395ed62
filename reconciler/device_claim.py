"""A budgeted pool's device shared through one ResourceClaim (Dynamic Resource Allocation,
`resource.k8s.io/v1`), read from what the API server holds.

A pool with `spec.device.claim` owns one ResourceClaim, and every member's pod references
it by name, so the scheduler places them all on the one device it allocates. This module
says whether the API server serves that API at all (its discovery answer), which device
the claim was allocated, the memory its driver publishes for that device (the
ResourceSlice's capacity `memory`), the budget the pool counts its members against, and
why a claim stays unallocated. Pure functions of bodies; `reconciler.pools` feeds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.quantity import QuantityError, format_bytes, parse_bytes
from reconciler.spec import ModelPoolSpec
from reconciler.swap import Problem

GROUP_VERSION = "resource.k8s.io/v1"
# The name the pods give the pool's claim (spec.resourceClaims[].name, and the container's
# resources.claims[].name), and the claim's one device request.
POD_CLAIM = "gpu"
REQUEST = "gpu"
MEMORY_CAPACITY = "memory"
# A claim pool's problems: the pool is Stalled and nothing is scaled.
CLAIMS_UNSUPPORTED = "DeviceClaimUnsupported"
CLAIMS_FORBIDDEN = "DeviceClaimForbidden"
DEVICE_MEMORY_UNKNOWN = "DeviceMemoryUnknown"


def claim_name(pool: str) -> str:
    """The pool's ResourceClaim (a pool's name is at most 63 characters)."""
    return f"{pool}-gpu"


def claims_served(discovery: Mapping[str, Any] | None) -> bool:
    """Whether the API server serves ResourceClaims in `resource.k8s.io/v1`, from its
    answer to `GET /apis/resource.k8s.io/v1` (an APIResourceList; None: not found)."""
    if discovery is None:
        return False
    names = {str(r.get("name")) for r in discovery.get("resources") or ()
             if isinstance(r, Mapping)}
    return {"resourceclaims", "resourceslices", "deviceclasses"} <= names


def unsupported_problem(spec: ModelPoolSpec, refused: str | None = None) -> Problem:
    """Why a claim pool cannot be served: the API is not served, or (`refused`, the API
    server's words) this reconciler may not read what it needs of it."""
    assert spec.claim is not None
    if refused is not None:
        return Problem(CLAIMS_FORBIDDEN, (
            "spec.device.claim needs the reconciler to manage ResourceClaims and read "
            "ResourceSlices and DeviceClasses, which the API server refuses it: nothing is "
            f"scaled. Grant what manifests/clusterrole.yaml grants, then restart it ({refused})"))
    return Problem(CLAIMS_UNSUPPORTED, (
        f"spec.device.claim needs the {GROUP_VERSION} API (Dynamic Resource Allocation, GA "
        "in Kubernetes 1.34), which this API server does not serve: nothing is scaled. "
        "Remove spec.device to share the device through a device plugin's shares "
        "(docs/api.md), or upgrade the cluster"))


@dataclass(frozen=True)
class Allocated:
    """The device a claim was allocated: its driver, the driver's pool and its name."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


def allocated(claim: Mapping[str, Any] | None) -> Allocated | None:
    """The device the claim's allocation holds for its request (None: not allocated)."""
    allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    for result in results:
        if result.get("request") in (REQUEST, None) or len(results) == 1:
            try:
                return Allocated(str(result["driver"]), str(result["pool"]),
                                 str(result["device"]))
            except KeyError:
                continue
    return None


def device_memory(slices: Iterable[Mapping[str, Any]], device: Allocated) -> int | None:
    """The memory the driver publishes for `device` (its capacity `memory`) in the newest
    generation of its pool's ResourceSlices; None where it publishes none."""
    found: tuple[int, int] | None = None  # (pool generation, bytes)
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        pool = spec.get("pool") or {}
        if spec.get("driver") != device.driver or pool.get("name") != device.pool:
            continue
        generation = int(pool.get("generation") or 0)
        for d in spec.get("devices") or ():
            if d.get("name") != device.device:
                continue
            capacity = ((d.get("capacity") or {}).get(MEMORY_CAPACITY) or {}).get("value")
            try:
                memory = parse_bytes(capacity, f"capacity {MEMORY_CAPACITY}")
            except QuantityError:
                continue
            if found is None or generation > found[0]:
                found = (generation, memory)
    return found[1] if found is not None else None


@dataclass(frozen=True)
class Device:
    """What a claim pool knows of its device."""

    claim: str
    allocated: Allocated | None = None
    memory: int | None = None  # bytes, as the driver publishes them


def budget(spec: ModelPoolSpec, device: Device | None,
           footprints: Mapping[str, int | None]) -> tuple[int, Problem | None]:
    """The budget a budgeted pool counts its members against: `spec.gpuMemory`, else the
    claimed device's memory. Until the claim is allocated (by the scheduler, for the first
    member's pod) that is not known: the pool counts against its largest footprint then,
    so its first load can be placed and allocate the claim. A device allocated with no
    memory published, and no `spec.gpuMemory`, is a problem of the spec."""
    if spec.gpu_memory is not None:
        return spec.gpu_memory, None
    if device is not None and device.memory is not None:
        return device.memory, None
    if device is not None and device.allocated is not None:
        return 0, Problem(DEVICE_MEMORY_UNKNOWN, (
            f"the pool's ResourceClaim {device.claim} holds {device.allocated}, whose driver "
            f"publishes no capacity {MEMORY_CAPACITY!r}: set spec.gpuMemory, the memory of "
            "the device its members may use"))
    return max((size for size in footprints.values() if size is not None), default=0), None


def share_memory(spec: ModelPoolSpec, device: Device | None) -> int | None:
    """The whole memory of the pool's device, what a member's share is a fraction of: the
    driver's word where it publishes one, else `spec.gpuMemory` (None: neither known)."""
    if device is not None and device.memory is not None:
        return device.memory
    return spec.gpu_memory


def status_of(device: Device, pool_budget: int | None) -> dict[str, Any]:
    """The pool's `status.device`."""
    return {
        "claim": device.claim,
        "allocated": str(device.allocated) if device.allocated is not None else None,
        "memory": device.memory,
        "budget": pool_budget,
    }


def unallocated(class_name: str, classes: Iterable[Mapping[str, Any]],
                slices: Iterable[Mapping[str, Any]]) -> str:
    """Why a claim of `class_name` is not allocated, as far as the API server's objects
    say: the DeviceClass is missing, or no driver publishes any device."""
    if not any(((c.get("metadata") or {}).get("name")) == class_name for c in classes):
        return (f"DeviceClass {class_name} does not exist: install its DRA driver, or name "
                "another in spec.device.claim.deviceClassName")
    if not any((s.get("spec") or {}).get("devices") for s in slices):
        return "no ResourceSlice publishes a device: no DRA driver runs on any node"
    return f"no device of class {class_name} is free on a node the pod may run on"


def explain(member: str, message: str, claim: str, class_name: str, why: str) -> str:
    """One line: which member, the scheduler's words, and why the pool's claim is not
    allocated."""
    return (f"{member} cannot be scheduled: {message.strip()} ResourceClaim {claim} "
            f"(device class {class_name}) is not allocated: {why}")


def describe(memory: int | None) -> str:
    return format_bytes(memory) if memory is not None else "unknown"
