"""A budgeted ModelPool's status as the residency state says it, and that state read back
from status (pure): the counterpart of `pool_status` for `reconciler.residency`.

Beside the fields every pool shows, a budgeted pool's status lists its `residents` (name,
since, footprint in bytes, last used), the `roomLeft` of its budget and the `loads` under
way (target, request generation, phase, start, the victims drained for it). `residentMember`
names the resident loaded last and `swap` the first load under way, in the exclusive
pool's shape, for `kubectl get mpool` and readers of the exclusive pool's fields; routers
read `residents` and `loads` (docs/contracts.md section 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler import conditions as cond
from reconciler import residency as r
from reconciler.pool_status import (
    conditions,
    last_swap,
    phases_value,
    request_of,
    restores_value,
    swap_of,
)
from reconciler.timefmt import parse, rfc3339

OWNED_KEYS = (
    "phase",
    "residentMember",
    "residentSince",
    "residents",
    "residentMembers",
    "roomLeft",
    "loads",
    "swap",
    "lastSwap",
    "idleUnloaded",
    "members",
    "conditions",
    "observedGeneration",
)


def restore(config: r.ResidencyConfig, generation: int,
            status: Mapping[str, Any] | None) -> r.ResidencyState:
    """The residency state that `status` describes (members not yet observed): what lets
    a restarted reconciler carry on with the residents and the loads it had."""
    status = status or {}
    residents: dict[str, r.Resident] = {}
    for raw in status.get("residents") or ():
        if isinstance(raw, Mapping) and raw.get("name") in config.members:
            since = parse(raw.get("since")) or 0.0
            residents[str(raw["name"])] = r.Resident(
                str(raw["name"]), since, parse(raw.get("lastUsed")) or since)
    loads = []
    for raw in status.get("loads") or ():
        load = _load(raw, config)
        if load is not None and load.to not in residents:
            loads.append(load)
    last = _last_load(status.get("lastSwap"))
    request = request_of(status)
    answered = last.generation or 0 if last is not None and last.generation else 0
    if request is not None and request.member is not None and request.member in residents:
        answered = max(answered, request.generation)
    return r.ResidencyState(config=config, generation=generation, request=request,
                            residents=residents, loads=tuple(loads), last_load=last,
                            answered=answered)


def _load(raw: Any, config: r.ResidencyConfig) -> r.Load | None:
    """One of `loads` read as a swap is (`pool_status`), with the victims it drains."""
    swap = swap_of(raw)
    if swap is None or swap.to not in config.members:
        return None
    victims = tuple(str(v) for v in raw.get("victims") or () if v in config.members)
    return r.Load(to=swap.to, generation=swap.generation, phase=swap.phase,
                  started=swap.started, phase_started=swap.started, victims=victims,
                  staged=swap.phase is not r.Phase.DRAINING)


def _last_load(raw: Any) -> r.LastLoad | None:
    """`lastSwap` read as the swap's (`pool_status`), with the members it evicted."""
    last = last_swap(raw)
    if last is None:
        return None
    evicted = raw.get("evicted")
    return r.LastLoad(
        to=last.to, generation=last.generation, start=last.start, duration=last.duration,
        outcome=last.outcome,
        evicted=tuple(str(e) for e in evicted) if isinstance(evicted, list) else (),
        reason=last.reason, message=last.message, phases=last.phases)


def _latest(state: r.ResidencyState) -> r.Resident | None:
    return max(state.residents.values(), key=lambda x: (x.since, x.member), default=None)


def member_phase(state: r.ResidencyState, member: str) -> str:
    observed = state.observed or r.MemberPods()
    if observed.ready.get(member, 0) > 0:
        return "Ready"
    if observed.count(member) > 0:
        return "Loading"
    return "Stopped"


def _progress(load: r.Load) -> str:
    evicting = f" (evicting {', '.join(load.victims)})" if load.victims else ""
    return f"-> {load.to}{evicting}: {load.phase.value}"


def pool_conditions(state: r.ResidencyState) -> list[cond.Condition]:
    phase = r.phase_of(state)
    loads = r.visible_loads(state)
    first = loads[0] if loads else None
    names = ", ".join(sorted(state.residents))
    if phase == "Ready":
        ready = (True, "Resident", f"{names} resident")
    elif phase == "Swapping" and first is not None:
        ready = (False, "Swapping", _progress(first))
    elif phase == "Cold":
        ready = (False, "Cold", "no member is resident")
    else:
        not_ready = [m for m in sorted(state.residents)
                     if (state.observed or r.MemberPods()).ready.get(m, 0) < 1]
        ready = (False, "ResidentNotReady",
                 f"{', '.join(not_ready) or names or '(none)'} has no Ready pod")
    deferred = next((x.deferral for x in loads if x.deferral is not None), None)
    return conditions(ready, first, _progress(first) if first is not None else None,
                      state.problem, deferred)


def pool_status(state: r.ResidencyState, previous: Mapping[str, Any] | None,
                now: float) -> dict[str, Any]:
    """Every status field the reconciler owns on a budgeted pool; None means absent."""
    previous = previous or {}
    latest = _latest(state)
    loads = r.visible_loads(state)
    first = loads[0] if loads else None
    last = state.last_load
    gone = max(state.idle_unloads.values(), key=lambda g: g.at, default=None)
    return {
        "phase": r.phase_of(state),
        "residentMember": latest.member if latest is not None else None,
        "residentSince": rfc3339(latest.since) if latest is not None else None,
        "residents": [
            {"name": v.name, "since": rfc3339(v.since), "gpuMemory": v.footprint,
             "lastUsed": rfc3339(v.last_used)}
            for v in r.residents_of(state)
        ],
        "residentMembers": ",".join(v.name for v in r.residents_of(state)),
        "roomLeft": r.room_left(state),
        "loads": [
            {"to": x.to, "generation": x.generation, "phase": x.phase.value,
             "startedAt": rfc3339(x.started), "victims": list(x.victims),
             **restores_value(state.config, x.to)}
            for x in loads
        ],
        "swap": None if first is None else {
            "from": first.victims[0] if first.victims else None,
            "to": first.to,
            "generation": first.generation,
            "phase": first.phase.value,
            "startedAt": rfc3339(first.started),
            **restores_value(state.config, first.to),
        },
        "lastSwap": None if last is None else {k: v for k, v in {
            "from": last.evicted[0] if last.evicted else None,
            "to": last.to,
            "evicted": list(last.evicted),
            "generation": last.generation,
            "start": rfc3339(last.start),
            "durationSeconds": round(last.duration, 3),
            "outcome": last.outcome.value,
            "reason": last.reason,
            "message": last.message,
            "phases": phases_value(last.phases),
        }.items() if v is not None},
        "idleUnloaded": None if gone is None else {
            "member": gone.member,
            "time": rfc3339(gone.at),
            "idleSeconds": round(gone.idle_for, 1),
        },
        "members": [
            {"name": m, "phase": member_phase(state, m), "resident": m in state.residents,
             "gpuMemory": state.config.footprints.get(m)}
            for m in state.config.members
        ],
        "conditions": cond.merge(previous.get("conditions"), pool_conditions(state),
                                 now=rfc3339(now), observed_generation=state.generation),
        "observedGeneration": state.generation,
    }
