"""The compare-and-swap on a ModelPool's `status.request` (docs/contracts.md section 2).

Routers write a request, the reconciler clears one; several of each may race. A write is
a JSON Patch on the status subresource whose first op is a `test`: of the generation of
the request that was read when there was one, else of the object's resourceVersion. A
write that lost its race fails that test and is answered 422: read again, decide again.
Only the patch: each program's kube module sends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Op = dict[str, Any]


def request_ops(
    request: Mapping[str, Any],
    expected: int | None,
    resource_version: str,
    status_present: bool,
) -> list[Op]:
    """The patch writing `request` (its generation included): it replaces the request at
    generation `expected`, or, when none was read, is added to the status (or is the
    first field of a status that does not exist yet) at `resource_version`."""
    if expected is not None:
        return [
            {"op": "test", "path": "/status/request/generation", "value": expected},
            {"op": "replace", "path": "/status/request", "value": dict(request)},
        ]
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    if status_present:
        return [test, {"op": "add", "path": "/status/request", "value": dict(request)}]
    return [test, {"op": "add", "path": "/status", "value": {"request": dict(request)}}]


def next_request_ops(
    status: Mapping[str, Any] | None, resource_version: str, request: Mapping[str, Any]
) -> list[Op]:
    """The patch writing `request` (without a generation) after the one `status` holds,
    as a router does: at that request's generation + 1, else at 1."""
    current = (status or {}).get("request")
    if isinstance(current, Mapping) and isinstance(current.get("generation"), int):
        generation = int(current["generation"])
        return request_ops({**request, "generation": generation + 1}, generation,
                           resource_version, True)
    return request_ops({**request, "generation": 1}, None, resource_version, status is not None)


def clear_request_ops(generation: int, cleared: Mapping[str, Any]) -> list[Op]:
    """The patch clearing a request only while it is still at `generation` (a newer one is
    kept)."""
    return request_ops({**cleared, "generation": generation + 1}, generation, "", True)
