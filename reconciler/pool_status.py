"""A ModelPool's status as the swap state says it, and the swap state read back from status.

The reconciler writes every field of `status` but `request` (docs/contracts.md section 2).
What it writes is a pure projection of the swap state, so the shell can compare it with
the object and write only when something changed: an idle reconciler makes no writes.
Reading the state back from status is what lets a restarted reconciler, or a new leader,
carry on with a swap that was running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from reconciler import conditions as cond
from reconciler import swap as s
from reconciler.timefmt import parse, rfc3339

# The keys of status the reconciler owns; `request` belongs to the routers.
OWNED_KEYS = (
    "phase",
    "residentMember",
    "residentSince",
    "swap",
    "lastSwap",
    "idleUnloaded",
    "members",
    "conditions",
    "observedGeneration",
)


def request_of(status: Mapping[str, Any] | None) -> s.Request | None:
    raw = (status or {}).get("request")
    if not isinstance(raw, Mapping):
        return None
    generation = raw.get("generation")
    member = raw.get("member")
    if not isinstance(generation, int) or isinstance(generation, bool):
        return None
    return s.Request(member if isinstance(member, str) and member else None, generation)


def restore(config: s.PoolConfig, generation: int, status: Mapping[str, Any] | None) -> s.PoolState:
    """The swap state that `status` describes (members not yet observed)."""
    status = status or {}
    resident = status.get("residentMember") or None
    last = last_swap(status.get("lastSwap"))
    swap = swap_of(status.get("swap"))
    request = request_of(status)
    answered = last.generation or 0 if last is not None else 0
    if request is not None and request.member is not None and request.member == resident:
        answered = max(answered, request.generation)
    idle_unloaded = None if resident else _idle_unloaded(status.get("idleUnloaded"))
    return s.PoolState(
        config=config,
        generation=generation,
        request=request,
        resident=resident if isinstance(resident, str) else None,
        resident_since=parse(status.get("residentSince")),
        swap=swap,
        last_swap=last,
        answered=answered,
        idle_unloaded=idle_unloaded,
    )


def _idle_unloaded(raw: Any) -> s.IdleUnload | None:
    if not isinstance(raw, Mapping) or not raw.get("member"):
        return None
    idle = raw.get("idleSeconds")
    return s.IdleUnload(
        member=str(raw["member"]),
        at=parse(raw.get("time")) or 0.0,
        idle_for=float(idle) if isinstance(idle, int | float) else 0.0,
    )


def swap_of(raw: Any) -> s.Swap | None:
    """`status.swap` (or one of a budgeted pool's `loads`) read back; None when absent or
    untrustworthy."""
    if not isinstance(raw, Mapping) or not raw.get("to"):
        return None
    try:
        phase = s.Phase(str(raw.get("phase")))
    except ValueError:
        return None
    started = parse(raw.get("startedAt"))
    if started is None:
        return None
    generation = raw.get("generation")
    return s.Swap(
        from_=raw.get("from") or None,
        to=str(raw["to"]),
        generation=generation if isinstance(generation, int) else None,
        phase=phase,
        started=started,
        phase_started=started,
    )


def last_swap(raw: Any) -> s.LastSwap | None:
    """`status.lastSwap` read back, or None when it is absent or cannot be trusted."""
    if not isinstance(raw, Mapping) or not raw.get("to"):
        return None
    try:
        outcome = s.Outcome(str(raw.get("outcome")))
    except ValueError:
        return None
    generation = raw.get("generation")
    duration = raw.get("durationSeconds")
    return s.LastSwap(
        from_=raw.get("from") or None,
        to=str(raw["to"]),
        generation=generation if isinstance(generation, int) else None,
        start=parse(raw.get("start")) or 0.0,
        duration=float(duration) if isinstance(duration, int | float) else 0.0,
        outcome=outcome,
        reason=raw.get("reason"),
        message=raw.get("message"),
        phases=phases_of(raw.get("phases")),
    )


def restores_value(config: s.PoolConfig, member: str) -> dict[str, bool]:
    """`restores: true` on a swap or load whose target goes through Restoring: the
    routers send it nothing early, before its slots are back."""
    return {"restores": True} if config.restores(member) else {}


def phases_of(raw: Any) -> tuple[tuple[str, float], ...]:
    """`lastSwap.phases` read back: each phase's name and seconds, in order."""
    if not isinstance(raw, list):
        return ()
    return tuple((str(p["name"]), float(p["seconds"])) for p in raw
                 if isinstance(p, Mapping) and isinstance(p.get("seconds"), int | float))


def phases_value(phases: tuple[tuple[str, float], ...]) -> list[dict[str, Any]] | None:
    """A completed swap's phases for `lastSwap.phases` (None: absent)."""
    return [{"name": n, "seconds": round(t, 3)} for n, t in phases] or None


def member_phase(state: s.PoolState, member: str) -> str:
    observed = state.observed or s.MemberPods()
    if observed.ready.get(member, 0) > 0:
        return "Ready"
    if observed.count(member) > 0:
        return "Loading"
    return "Stopped"


def pool_conditions(state: s.PoolState) -> list[cond.Condition]:
    phase = s.phase_of(state)
    swap = s.visible_swap(state)
    if phase == "Ready":
        ready = (True, "Resident", f"{state.resident} is resident")
    elif phase == "Swapping" and swap is not None:
        ready = (False, "Swapping", f"{swap.from_ or '(none)'} -> {swap.to}: {swap.phase.value}")
    elif phase == "Cold" and state.idle_unloaded is not None:
        # Cold as asked (spec.idleUnloadAfter): the pool is as it should be, and serves
        # by loading a member for the next request.
        gone = state.idle_unloaded
        ready = (True, s.IDLE_UNLOADED, f"{gone.member} served nothing for "
                 f"{gone.idle_for:.0f}s and was unloaded; the next request loads a member")
    elif phase == "Cold":
        ready = (False, "Cold", "no member is resident")
    else:
        failing = (state.observed or s.MemberPods()).failing.get(state.resident or "")
        why = f"; {failing[1]}" if failing is not None else ""
        ready = (False, "ResidentNotReady", f"{state.resident} has no Ready pod{why}")
    progress = None if swap is None else (
        f"{swap.from_ or '(none)'} -> {swap.to}: {swap.phase.value}")
    return conditions(ready, swap, progress, state.problem,
                      swap.deferral if swap is not None else None)


class Progress(Protocol):
    """What status says of a swap or a load under way that cannot go on."""

    @property
    def unschedulable(self) -> str | None: ...

    @property
    def not_created(self) -> str | None: ...

    @property
    def failing(self) -> tuple[str, str] | None: ...


def conditions(ready: tuple[bool, str, str], progress: Progress | None,
               progress_message: str | None, problem: s.Problem | None,
               deferral: s.Deferral | None) -> list[cond.Condition]:
    """A pool's conditions from its Ready verdict, the swap (or load) under way and what
    it says of itself, the spec's problem and the swap's deferral: an exclusive pool's
    and a budgeted pool's alike."""
    reconciling = None
    if progress is not None and progress.unschedulable is not None:
        # The swap cannot go on until the scheduler places the target: say why, in Ready
        # (what `kubectl get` and GitOps tools show) and in Reconciling.
        reconciling = (s.UNSCHEDULABLE, progress.unschedulable)
        ready = (False, s.UNSCHEDULABLE, progress.unschedulable)
    elif progress is not None and progress.not_created is not None:
        reconciling = (s.FAILED_CREATE, progress.not_created)
        ready = (False, s.FAILED_CREATE, progress.not_created)
    elif progress is not None and progress.failing is not None:
        reconciling = progress.failing
        ready = (False, *progress.failing)
    elif progress is not None and progress_message is not None:
        reconciling = ("Swapping", progress_message)
    stalled = None
    if problem is not None and problem.pending:
        reconciling = (problem.reason, problem.message)
    elif problem is not None:
        stalled = (problem.reason, problem.message)
    found = cond.kstatus(ready=ready, reconciling=reconciling, stalled=stalled)
    if deferral is not None:
        found.append(cond.Condition(cond.SWAP_DEFERRED, True, deferral.reason,
                                    deferral.message))
    else:
        found.append(cond.Condition(cond.SWAP_DEFERRED, False, "NotDeferred"))
    return found


def pool_status(
    state: s.PoolState, previous: Mapping[str, Any] | None, now: float
) -> dict[str, Any]:
    """Every status field the reconciler owns; None means the field must be absent."""
    previous = previous or {}
    swap = s.visible_swap(state)
    last = state.last_swap
    return {
        "phase": s.phase_of(state),
        "residentMember": state.resident,
        "residentSince": rfc3339(state.resident_since) if state.resident_since else None,
        "swap": None if swap is None else {
            "from": swap.from_,
            "to": swap.to,
            "generation": swap.generation,
            "phase": swap.phase.value,
            "startedAt": rfc3339(swap.started),
            **restores_value(state.config, swap.to),
        },
        "lastSwap": None if last is None else _drop_none({
            "from": last.from_,
            "to": last.to,
            "generation": last.generation,
            "start": rfc3339(last.start),
            "durationSeconds": round(last.duration, 3),
            "outcome": last.outcome.value,
            "reason": last.reason,
            "message": last.message,
            "phases": phases_value(last.phases),
        }),
        "idleUnloaded": None if state.idle_unloaded is None else {
            "member": state.idle_unloaded.member,
            "time": rfc3339(state.idle_unloaded.at),
            "idleSeconds": round(state.idle_unloaded.idle_for, 1),
        },
        "members": [
            {"name": m, "phase": member_phase(state, m), "resident": m == state.resident}
            for m in state.config.members
        ],
        "conditions": cond.merge(
            previous.get("conditions"),
            pool_conditions(state),
            now=rfc3339(now),
            observed_generation=state.generation,
        ),
        "observedGeneration": state.generation,
    }


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}
