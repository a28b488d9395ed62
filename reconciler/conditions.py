"""kstatus conditions: Ready, Reconciling, Stalled (and the pool's SwapDeferred).

Flux, Argo CD and `kubectl wait` read these; their rules (kstatus) are: `Ready` says
whether the object does its job, `Reconciling` is True only while the reconciler is
still moving towards the spec, `Stalled` is True only when it cannot get there without a
change to the spec, and `observedGeneration` says which spec all of it describes. A
condition keeps its `lastTransitionTime` until its status changes, so recomputing the
same conditions yields the same status and causes no write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
SWAP_DEFERRED = "SwapDeferred"


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


def kstatus(
    *,
    ready: tuple[bool, str, str],
    reconciling: tuple[str, str] | None = None,
    stalled: tuple[str, str] | None = None,
) -> list[Condition]:
    """The three standard conditions: `ready` is (status, reason, message); `reconciling`
    and `stalled` are (reason, message) when True, None when False."""
    ready_status, ready_reason, ready_message = ready
    if stalled is not None:
        ready_status, ready_reason, ready_message = False, stalled[0], stalled[1]
        reconciling = None  # kstatus: a stalled object is not making progress
    return [
        Condition(READY, ready_status, ready_reason, ready_message),
        Condition(RECONCILING, True, *reconciling)
        if reconciling is not None
        else Condition(RECONCILING, False, "Reconciled"),
        Condition(STALLED, True, *stalled)
        if stalled is not None
        else Condition(STALLED, False, "Valid"),
    ]


def merge(
    previous: Sequence[Mapping[str, Any]] | None,
    desired: Sequence[Condition],
    *,
    now: str,
    observed_generation: int,
) -> list[dict[str, Any]]:
    """The conditions to write: `desired` in order, each keeping the previous
    lastTransitionTime while its status is unchanged."""
    before = {c.get("type"): c for c in previous or () if isinstance(c, Mapping)}
    merged: list[dict[str, Any]] = []
    for condition in desired:
        status = "True" if condition.status else "False"
        old = before.get(condition.type)
        since = now
        if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since,
                "observedGeneration": observed_generation,
            }
        )
    return merged


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)
