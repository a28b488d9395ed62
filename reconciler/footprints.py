"""Each member's footprint in a budgeted pool, and what stops the pool from acting on them.

A pool with `spec.gpuMemory` counts its members by the GPU memory each takes when loaded:
the `gpuMemory` of the member's entry in `spec.members`, else its ModelServer's
`spec.resources.gpuMemory`. Admission sees only the pool, so it refuses an entry larger
than the budget; a member with no footprint at all, or whose ModelServer states one larger
than the budget, can only be seen here, with both objects in hand. Either is a problem of
the spec: the pool is Stalled and nothing is scaled (pure).
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.quantity import format_bytes
from reconciler.spec import ModelPoolSpec, ModelServerSpec
from reconciler.swap import Problem

FOOTPRINT_MISSING = "MemberFootprintMissing"
FOOTPRINT_OVER_BUDGET = "MemberFootprintOverBudget"


def footprints(pool: ModelPoolSpec,
               servers: Mapping[str, ModelServerSpec]) -> dict[str, int | None]:
    """Each member's footprint in bytes, the entry's before the ModelServer's; None where
    neither states one (or the server is not in `servers`)."""
    found: dict[str, int | None] = {}
    for member in pool.members:
        server = servers.get(member.name)
        found[member.name] = (member.gpu_memory if member.gpu_memory is not None
                              else server.resources.gpu_memory if server is not None
                              else None)
    return found


def footprint_problem(pool: ModelPoolSpec, servers: Mapping[str, ModelServerSpec],
                      budget: int | None = None) -> Problem | None:
    """Why a budgeted pool cannot count its members against `budget` (by default its
    `spec.gpuMemory`; a claim pool's may be its device's memory); None for a pool
    without a budget."""
    if budget is None:
        budget = pool.gpu_memory
    if budget is None or not pool.budgeted:
        return None
    sizes = footprints(pool, servers)
    missing = [name for name, size in sizes.items() if size is None]
    if missing:
        return Problem(FOOTPRINT_MISSING, (
            f"{_stated(pool)} but no footprint is stated for "
            f"{', '.join(missing)}: set gpuMemory on the member's entry in spec.members "
            "or spec.resources.gpuMemory on its ModelServer"))
    over = [f"{name} ({format_bytes(size)})" for name, size in sizes.items()
            if size is not None and size > budget]
    if over:
        return Problem(FOOTPRINT_OVER_BUDGET, (
            f"members larger than {_what(pool)} ({format_bytes(budget)}): "
            + ", ".join(over)))
    return None


def _what(pool: ModelPoolSpec) -> str:
    return "spec.gpuMemory" if pool.gpu_memory is not None else "the claimed device's memory"


def _stated(pool: ModelPoolSpec) -> str:
    if pool.gpu_memory is not None:
        return f"spec.gpuMemory is {format_bytes(pool.gpu_memory)}"
    return "the pool shares a claimed device by memory (spec.device.claim)"
