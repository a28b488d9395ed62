"""Waiting for a ModelServer that a pool or a router names but the reconciler has not
seen yet: for a while that is progress (Reconciling), not a fault (Stalled).

Objects applied together (as `kubectl apply -k` and GitOps tools do) reach the reconciler
in any order, on creation and on every change of spec alike (a commit that adds a member
to a pool and the member itself). So for `standalone_settle_seconds` from the first time
a generation of the spec is seen, while its status is not yet Stalled for it, the object
waits and is looked at again when the server appears or the time is up. A restarted
reconciler keeps a Stalled status Stalled: its spec was judged before."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reconciler import conditions as cond
from reconciler.objects import meta
from reconciler.stores import Key

WAITING_FOR_MEMBERS = "WaitingForMembers"
WAITING_FOR_SERVER = "WaitingForModelServer"


class Settling:
    def __init__(self, clock: Callable[[], float], settle_seconds: float) -> None:
        self.clock = clock
        self.settle_seconds = settle_seconds
        # (generation, when first seen) per pool and router
        self.first_seen: dict[Key, tuple[int, float]] = {}

    def remaining(self, kind: str, body: Mapping[str, Any]) -> float | None:
        """Seconds `body` may still wait for what it names (the key is to be looked at
        again then), or None when it waits no longer."""
        m = meta(body)
        key = Key(kind, str(m.get("namespace")), str(m.get("name")))
        generation = int(m.get("generation") or 0)
        status = body.get("status") or {}
        reconciling = cond.find(status.get("conditions"), cond.RECONCILING) or {}
        judged = status.get("observedGeneration") == generation and not (
            reconciling.get("status") == "True"
            and reconciling.get("reason") in (WAITING_FOR_MEMBERS, WAITING_FOR_SERVER))
        now = self.clock()
        seen = self.first_seen.get(key)
        if seen is None or seen[0] != generation:
            seen = self.first_seen[key] = (generation, now)
        remaining = self.settle_seconds - (now - seen[1])
        if judged or remaining <= 0:
            return None
        return remaining

    def forget(self, key: Key) -> None:
        self.first_seen.pop(key, None)
