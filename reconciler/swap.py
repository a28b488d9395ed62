"""The pool's swap, as a pure state machine.

One ModelPool owns one exclusive GPU slot. This module decides, from what the reconciler
observed (the spec, the routers' request, the members' pods, the idle probe's answers)
and the time it is given, what to do next: probe the incumbent, scale a member, clear a
request, post an Event, record a metric. It performs none of it: `step` returns the new
state and a list of actions, and the shell in `reconciler.pools` executes them. No
awaits, no clock reads, no I/O, so every rule below is tested by tables of cases.

The rules (the status they show: docs/contracts.md section 2; the parts around them:
docs/architecture.md):

- A request whose member differs from the resident starts a swap; a cold pool with a
  `default` loads it. A request already answered (its generation was abandoned, failed or
  withdrawn) is never acted on twice.
- Draining: `minResidency` must have been served (unless the target has a higher
  `priority` than the incumbent) and the incumbent's idle probe must say idle. Busy or
  unreachable defers (`PodsBusy`, `IdleCheckFailed`, fail closed); a member that can
  never be probed fails the swap at once (`IdleProbeUnsupported`). A newer request
  retargets the swap, or withdraws it when it names the incumbent or nobody.
- swapPolicy reclaim: an idle member other than the default, resident for
  `reclaimAfter`, hands the slot back to the default; a busy one is left alone.
- idleUnloadAfter: the resident is probed for activity (a mark its runtime changes with
  every request served, and busy or idle) every quarter of it, at most every 15 s; one
  that served nothing for that long is scaled to 0 and the pool goes Cold, the default
  not loaded again until a request comes. A probe that fails counts as activity (fail
  closed: the member stays).
- Unloading: every other member is scaled to 0 and the swap waits until their pods are
  gone (terminating pods still hold the GPU), and the target's own terminating pods too
  (a member unloaded for idleness and asked for again). A withdrawal is no longer honoured.
- Staging: the target is scaled to 1 as the unload begins. Every pool member's pods are
  created with a scheduling gate (`released` below says whose the shell lifts), so its
  pod waits unplaced while the incumbent unloads: the controllers' chain from Deployment
  to pod is off the swap's path, and no node can run it before its turn.
- Loading: the target's gate is lifted only then, and the swap waits for it to be Ready.
- Saving: an incumbent that keeps its KV cache (`spec.kvCache.persist`) is saved once its
  drain found it idle, before it is scaled to 0, and so is a member unloaded for
  idleness; a restore follows the target's load once it is Ready, before it is resident
  (`reconciler.kv_phases`, shared with the budgeted pool).
- The whole swap is bounded by `swapBudget` from its start: past it the swap is
  abandoned, the target scaled back to 0, the request cleared by compare-and-swap (a
  swap Restoring is bounded by its restore's cap instead: its target is Ready).
- While the spec has a problem (a missing member, a member in two pools) nothing starts
  and nothing is scaled; only the deadline still applies to a swap already running.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from reconciler import kv_phases
from reconciler.kv_phases import (
    Pending,
    RecordKvAbandoned,
    RestoreResult,
    RestoreSlots,
    SaveResult,
    SaveSlots,
)


class Phase(StrEnum):
    DRAINING = "Draining"
    SAVING = "Saving"
    UNLOADING = "Unloading"
    LOADING = "Loading"
    RESTORING = "Restoring"


# Phases in which the incumbent still holds the slot (resident, its pods running).
HOLDING = (Phase.DRAINING, Phase.SAVING)


class Verdict(StrEnum):
    """What an idle probe of the incumbent answered."""

    IDLE = "idle"
    BUSY = "busy"
    FAILED = "failed"
    UNSUPPORTED = "unsupported"


class Outcome(StrEnum):
    SUCCEEDED = "Succeeded"
    ABANDONED = "Abandoned"
    FAILED = "Failed"
    WITHDRAWN = "Withdrawn"


# Reasons, CamelCase as Kubernetes reasons are.
MIN_RESIDENCY = "MinResidency"
PODS_BUSY = "PodsBusy"
IDLE_CHECK_FAILED = "IdleCheckFailed"
IDLE_PROBE_UNSUPPORTED = "IdleProbeUnsupported"
SWAP_BUDGET_EXCEEDED = "SwapBudgetExceeded"
NOT_A_MEMBER = "NotAMember"
UNSCHEDULABLE = "Unschedulable"
FAILED_CREATE = "FailedCreate"
IDLE_UNLOADED = "IdleUnloaded"
IDLE_UNLOAD_UNSUPPORTED = "IdleUnloadUnsupported"
# The longest wait between two activity probes of the resident (idleUnloadAfter).
MAX_ACTIVITY_INTERVAL = 15.0

# Metric phase names: the `phase` label of swap_phase_duration_seconds (`reconciler.metrics`).
METRIC_PHASES = ("drain", "save", "unload", "schedule", "load", "restore")


@dataclass(frozen=True)
class PoolConfig:
    """What the swap needs from the pool's spec (durations in seconds)."""

    members: tuple[str, ...]
    default: str | None = None
    policy: str = "sticky"
    swap_budget: float = 300.0
    min_residency: float = 0.0
    # How often a deferred swap probes the incumbent again; from settings, not the spec.
    probe_interval: float = 2.0
    # swapPolicy reclaim: after this long resident, an idle non-default member hands the
    # slot back to the default.
    reclaim_after: float | None = None
    # spec.members[].priority: a higher member preempts a lower one as soon as its
    # in-flight requests finish, without waiting out minResidency.
    priorities: Mapping[str, int] = field(default_factory=dict)
    # spec.idleUnloadAfter: a resident that served nothing this long is unloaded.
    idle_unload_after: float | None = None
    # spec.kvCache.persist: each member that saves its slots on unload, and its
    # saveTimeout (the cap of a save and of a restore).
    kv_caps: Mapping[str, float] = field(default_factory=dict)
    # The members among those with saved slots waiting to be restored (a manifest).
    kv_saved: frozenset[str] = frozenset()

    @property
    def activity_interval(self) -> float:
        """How often the resident is probed for activity under idleUnloadAfter."""
        after = self.idle_unload_after or 0.0
        return min(MAX_ACTIVITY_INTERVAL, max(self.probe_interval, after / 4))

    def outranks(self, member: str, other: str) -> bool:
        return self.priorities.get(member, 0) > self.priorities.get(other, 0)

    def restores(self, member: str) -> bool:
        """Whether a load of `member` goes through Restoring: it keeps its KV cache and
        has saved slots."""
        return member in self.kv_caps and member in self.kv_saved


@dataclass(frozen=True)
class Problem:
    """Why the spec cannot be acted on (a Stalled condition).

    A `pending` problem is one expected to pass on its own: a pool applied together with
    its members (kubectl apply -k, a GitOps sync) may reach the reconciler a moment before
    them. Nothing is scaled then either, but the pool is in progress (Cold, Reconciling),
    not Degraded and Stalled, and no Warning is posted."""

    reason: str
    message: str
    pending: bool = False


@dataclass(frozen=True)
class Request:
    """status.request as a router wrote it; member None is a withdrawal."""

    member: str | None
    generation: int


@dataclass(frozen=True)
class Deferral:
    reason: str
    message: str


@dataclass(frozen=True)
class Swap:
    from_: str | None
    to: str
    generation: int | None  # the request generation served; None for a default load
    phase: Phase
    started: float
    phase_started: float
    scheduled_at: float | None = None
    durations: tuple[tuple[str, float], ...] = ()
    deferral: Deferral | None = None
    probe_in_flight: bool = False
    next_probe: float = 0.0
    # A return to the default (swapPolicy reclaim): only ever taken from an idle member;
    # a busy one, or any request, calls it off without a trace.
    reclaim: bool = False
    # While Loading: why the scheduler will not place the target (its message, and what
    # holds the resource); None once it is placed or before it was refused.
    unschedulable: str | None = None
    # While Loading: why the target's pod cannot be created at all; None once it exists.
    not_created: str | None = None
    # While Loading: the kubelet's reason and message for a container of the target that
    # does not run; None once it runs.
    failing: tuple[str, str] | None = None


@dataclass(frozen=True)
class LastSwap:
    from_: str | None
    to: str
    generation: int | None
    start: float
    duration: float
    outcome: Outcome
    reason: str | None = None
    message: str | None = None
    phases: tuple[tuple[str, float], ...] = ()  # a completed swap's, in order


@dataclass(frozen=True)
class MemberPods:
    """Pods per member: all that exist (terminating ones too), scheduled, Ready, and for
    a member whose pod the scheduler refused, why (its message, and what holds what it
    lacks, as far as the reconciler sees)."""

    pods: Mapping[str, int] = field(default_factory=dict)
    scheduled: Mapping[str, int] = field(default_factory=dict)
    ready: Mapping[str, int] = field(default_factory=dict)
    unschedulable: Mapping[str, str] = field(default_factory=dict)
    terminating: Mapping[str, int] = field(default_factory=dict)
    # For a member with no pod: why its pods cannot be created (admission refused them).
    not_created: Mapping[str, str] = field(default_factory=dict)
    # For a member with no Ready pod: a container the kubelet cannot run (its waiting
    # reason, CrashLoopBackOff say, and a message).
    failing: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def count(self, member: str) -> int:
        return self.pods.get(member, 0)


@dataclass(frozen=True)
class Activity:
    """What idleUnloadAfter knows of the resident: its last activity mark (None before the
    first reading), when it was last seen serving (or became resident), and its probes."""

    member: str
    mark: str | None
    active_at: float
    next_probe: float
    probe_in_flight: bool = False
    unsupported: bool = False  # told once: the member can never be probed


@dataclass(frozen=True)
class IdleUnload:
    """The pool is Cold because `member` served nothing for `idle_for` seconds."""

    member: str
    at: float
    idle_for: float


@dataclass(frozen=True)
class PoolState:
    config: PoolConfig
    generation: int = 0
    problem: Problem | None = None
    request: Request | None = None
    resident: str | None = None
    resident_since: float | None = None
    swap: Swap | None = None
    last_swap: LastSwap | None = None
    # The newest request generation whose swap ended (any outcome): never acted on again.
    answered: int = 0
    # swapPolicy reclaim: the earliest time the resident is checked for idleness again.
    reclaim_at: float | None = None
    observed: MemberPods | None = None  # None until the members' pods were seen once
    activity: Activity | None = None
    idle_unloaded: IdleUnload | None = None
    # Saves and restores under way (`kv_phases`), by member.
    saves: Mapping[str, Pending] = field(default_factory=dict)
    restores: Mapping[str, Pending] = field(default_factory=dict)


# Events


@dataclass(frozen=True)
class SpecObserved:
    config: PoolConfig
    generation: int
    problem: Problem | None = None


@dataclass(frozen=True)
class RequestObserved:
    request: Request | None


@dataclass(frozen=True)
class MembersObserved:
    pods: MemberPods


@dataclass(frozen=True)
class IdleResult:
    member: str
    verdict: Verdict
    detail: str = ""


@dataclass(frozen=True)
class ActivityResult:
    """An activity probe of the resident (idleUnloadAfter): busy or idle, and its mark
    ("" where the runtime keeps no count of requests served)."""

    member: str
    verdict: Verdict
    mark: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Tick:
    pass


Event = (SpecObserved | RequestObserved | MembersObserved | IdleResult | ActivityResult | Tick
         | SaveResult | RestoreResult)


# Actions


@dataclass(frozen=True)
class ProbeIdle:
    member: str


@dataclass(frozen=True)
class ProbeActivity:
    member: str


@dataclass(frozen=True)
class Scale:
    member: str
    replicas: int


@dataclass(frozen=True)
class ClearRequest:
    """Clear status.request by compare-and-swap, if its generation is still this one."""

    generation: int


@dataclass(frozen=True)
class EmitEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class RecordSwap:
    from_: str | None
    to: str
    duration: float
    phases: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class RecordFailure:
    member: str
    reason: str


@dataclass(frozen=True)
class RecordDeferral:
    reason: str


@dataclass(frozen=True)
class RecordIdleUnload:
    member: str


Action = (ProbeIdle | ProbeActivity | Scale | ClearRequest | EmitEvent | RecordSwap
          | RecordFailure | RecordDeferral | RecordIdleUnload | SaveSlots | RestoreSlots
          | RecordKvAbandoned)


def step(state: PoolState, event: Event, now: float) -> tuple[PoolState, list[Action]]:
    """Apply one observation, then decide; returns the new state and what to do."""
    state, actions = _apply(state, event, now)
    # A decision can open the next one at once (nothing to unload, a target already
    # Ready); iterate to a fixed point, bounded because each pass advances a phase.
    for _ in range(8):
        new, more = _decide(state, now)
        actions += more
        if new == state:
            break
        state = new
    return state, actions


def next_wakeup(state: PoolState) -> float | None:
    """When the shell must step the pool again with a Tick, absent other events."""
    swap = state.swap
    kv = kv_phases.next_deadline(state.saves, state.restores)
    if swap is None:
        times = [t for t in (_reclaim_due_at(state), _activity_due_at(state), kv)
                 if t is not None]
        return min(times) if times else None
    times = [swap.started + state.config.swap_budget]
    if kv is not None:
        times.append(kv)
    if swap.phase is Phase.DRAINING and not swap.probe_in_flight:
        residency_end = _residency_end(state)
        if swap.deferral is not None and swap.deferral.reason == MIN_RESIDENCY:
            assert residency_end is not None
            times.append(residency_end)
        elif math.isfinite(swap.next_probe):
            times.append(swap.next_probe)
    return min(times)


def desired_replicas(state: PoolState) -> dict[str, int] | None:
    """Each member's replicas as the pool wants them; None while the spec has a problem
    (nothing is scaled then: the shell keeps whatever runs)."""
    if state.problem is not None:
        return None
    wanted = dict.fromkeys(state.config.members, 0)
    swap = state.swap
    if state.resident in wanted and (swap is None or swap.phase in HOLDING):
        wanted[state.resident] = 1
    if swap is not None and swap.phase not in HOLDING and swap.to in wanted:
        wanted[swap.to] = 1  # staged while the incumbent unloads: created, not placed
    for member in state.saves:  # runs until its slots are saved
        if member in wanted:
            wanted[member] = 1
    return wanted


def released(state: PoolState) -> frozenset[str]:
    """The members whose pods the scheduler may place: the shell lifts their scheduling
    gate. The resident while no swap is past its drain; a swap's target once it is
    Loading, that is once every other member's pods are gone. Nobody while the spec has a
    problem: a pod created then (a node drained, say) waits for the problem to be fixed."""
    if state.problem is not None:
        return frozenset()
    members = set(state.config.members)
    swap = state.swap
    if swap is not None and swap.phase not in HOLDING:
        return (frozenset({swap.to} & members)
                if swap.phase in (Phase.LOADING, Phase.RESTORING) else frozenset())
    return frozenset({state.resident} & members) if state.resident is not None else frozenset()


def visible_swap(state: PoolState) -> Swap | None:
    """The swap as status shows it: a reclaim check of an incumbent that may well be busy
    is not a swap until the incumbent was found idle."""
    swap = state.swap
    if swap is not None and swap.reclaim and swap.phase is Phase.DRAINING:
        return None
    return swap


def phase_of(state: PoolState) -> str:
    """The pool's phase: Cold, Ready, Swapping or Degraded."""
    if state.problem is not None and not state.problem.pending:
        return "Degraded"
    if visible_swap(state) is not None:
        return "Swapping"
    if state.resident is None:
        return "Cold"
    if state.observed is not None and state.observed.ready.get(state.resident, 0) < 1:
        return "Degraded"
    return "Ready"


# Applying observations


def _apply(state: PoolState, event: Event, now: float) -> tuple[PoolState, list[Action]]:
    if isinstance(event, SpecObserved):
        actions: list[Action] = []
        if (event.problem is not None and not event.problem.pending
                and event.problem != state.problem):
            actions.append(EmitEvent("Warning", event.problem.reason, event.problem.message))
        elif event.problem is None and state.problem is not None and not state.problem.pending:
            actions.append(EmitEvent("Normal", "SpecValid", "the pool's spec is valid again"))
        resident = state.resident
        if resident is not None and resident not in event.config.members:
            resident = None  # no longer a member: the pool stops counting it as loaded
        new = replace(
            state,
            config=event.config,
            generation=event.generation,
            problem=event.problem,
            resident=resident,
            resident_since=state.resident_since if resident else None,
        )
        return new, actions
    if isinstance(event, RequestObserved):
        return replace(state, request=event.request), []
    if isinstance(event, MembersObserved):
        return replace(state, observed=event.pods), []
    if isinstance(event, IdleResult):
        return _idle_result(state, event, now)
    if isinstance(event, ActivityResult):
        return _activity_result(state, event, now)
    if isinstance(event, SaveResult):
        saves = kv_phases.answer(state.saves, event.member)
        if saves is None:
            return state, []  # an answer to a question no longer asked
        state = replace(state, saves=saves)
        return state, _scale_saved(state, [event.member])
    if isinstance(event, RestoreResult):
        restores = kv_phases.answer(state.restores, event.member)
        return (state if restores is None else replace(state, restores=restores)), []
    return state, []


def _scale_saved(state: PoolState, members: list[str]) -> list[Action]:
    """Scale to 0 the members whose save ended and whom the pool no longer wants (an
    incumbent still Saving is scaled by its swap's unload)."""
    wanted = desired_replicas(state)
    if wanted is None:
        return []
    return [Scale(m, 0) for m in members if wanted.get(m) == 0]


def _expire_kv(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    """Saves and restores past their deadline: abandoned, told and counted."""
    expired = kv_phases.expire_both(state.saves, state.restores, now)
    if expired is None:
        return state, []
    actions: list[Action] = []
    for gone in expired.abandoned:
        actions += [gone.record, EmitEvent("Warning", gone.reason, gone.message)]
    state = replace(state, saves=expired.saves, restores=expired.restores)
    return state, actions + _scale_saved(state, expired.late_saves)


def _idle_result(state: PoolState, event: IdleResult, now: float) -> tuple[PoolState, list[Action]]:
    swap = state.swap
    if swap is None or swap.phase is not Phase.DRAINING or swap.from_ != event.member:
        return state, []  # an answer to a question no longer asked
    swap = replace(swap, probe_in_flight=False)
    if swap.reclaim and event.verdict is not Verdict.IDLE:
        return _call_off_reclaim(state, now), []
    if event.verdict is Verdict.IDLE:
        actions: list[Action] = []
        if swap.reclaim:
            message = (f"swapping {swap.from_} -> {swap.to}: reclaimed after "
                       f"{state.config.reclaim_after:g}s")
            actions.append(EmitEvent("Normal", "SwapStarted", message))
        state, more = _begin_saving(replace(state, swap=swap), now)
        return state, actions + more
    if event.verdict is Verdict.UNSUPPORTED:
        message = f"{event.member} can never be probed for idleness"
        if event.detail:
            message += f": {event.detail}"
        return _end(replace(state, swap=swap), now, Outcome.FAILED, IDLE_PROBE_UNSUPPORTED, message)
    if event.verdict is Verdict.BUSY:
        deferral = Deferral(PODS_BUSY, f"{event.member} is serving requests")
    else:
        deferral = Deferral(IDLE_CHECK_FAILED, f"idle check of {event.member} failed")
    if event.detail:
        deferral = replace(deferral, message=f"{deferral.message}: {event.detail}")
    swap = replace(swap, next_probe=now + state.config.probe_interval)
    return _defer(replace(state, swap=swap), deferral)


# Deciding


def _decide(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    if state.observed is None:
        return state, []
    new, expired = _expire_kv(state, now)
    if expired:
        return new, expired
    swap = state.swap
    if swap is not None:
        if (now >= swap.started + state.config.swap_budget
                and swap.phase is not Phase.RESTORING):
            if swap.reclaim and swap.phase is Phase.DRAINING:
                return _call_off_reclaim(state, now), []
            return _abandon(state, now)
        if state.problem is not None:
            return state, []
        if swap.phase is Phase.DRAINING:
            return _drain(state, swap, now)
        if swap.phase is Phase.SAVING:
            if swap.from_ in state.saves:
                return state, []
            return _begin_unloading(state, now)
        if swap.phase is Phase.UNLOADING:
            return _unload(state, swap, now)
        if swap.phase is Phase.RESTORING:
            if swap.to in state.restores:
                return state, []
            swap = replace(swap, durations=(*swap.durations,
                                            ("restore", now - swap.phase_started)))
            return _complete(replace(state, swap=swap), swap, now)
        return _load(state, swap, now)
    if state.problem is not None:
        return state, []
    new, actions = _maybe_start(state, now)
    if new != state or actions:
        return new, actions
    return _watch_activity(state, now)


def _maybe_start(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    request = state.request
    if request is not None and request.member is not None and not _answered(state, request):
        if request.member not in state.config.members:
            return _reject(state, request.member, request.generation, now)
        if request.member != state.resident:
            return _start(state, request.member, request.generation, now)
        return state, []
    default = state.config.default
    if (state.resident is None and default is not None and default in state.config.members
            and state.idle_unloaded is None):
        return _start(state, default, None, now)
    due = _reclaim_due_at(state)
    if due is not None and now >= due and default is not None:
        new, actions = _start(state, default, None, now, reclaim=True)
        return new, actions
    return state, []


def _reclaim_due_at(state: PoolState) -> float | None:
    """When swapPolicy reclaim next checks whether the resident can go back to default."""
    config = state.config
    if (
        config.policy != "reclaim"
        or config.reclaim_after is None
        or config.default is None
        or config.default not in config.members
        or state.resident in (None, config.default)
        or state.resident_since is None
        or state.problem is not None
    ):
        return None
    due = state.resident_since + config.reclaim_after
    if state.reclaim_at is not None:
        due = max(due, state.reclaim_at)
    return due


def _answered(state: PoolState, request: Request) -> bool:
    """A request whose swap already ended: succeeded, abandoned, failed or withdrawn."""
    return request.generation <= state.answered


def _start(
    state: PoolState, target: str, generation: int | None, now: float, reclaim: bool = False
) -> tuple[PoolState, list[Action]]:
    incumbent = state.resident
    phase = Phase.DRAINING if incumbent is not None else Phase.UNLOADING
    swap = Swap(
        from_=incumbent,
        to=target,
        generation=generation,
        phase=phase,
        started=now,
        phase_started=now,
        reclaim=reclaim,
    )
    new = replace(state, swap=swap, activity=None, idle_unloaded=None)
    if reclaim:
        return new, []  # announced only if the incumbent turns out idle
    why = f"request {generation}" if generation is not None else "the pool's default"
    message = f"swapping {incumbent or '(none)'} -> {target} for {why}"
    actions: list[Action] = [EmitEvent("Normal", "SwapStarted", message)]
    if phase is Phase.UNLOADING:
        new, more = _begin_unloading(new, now)
        actions += more
    return new, actions


def _reject(
    state: PoolState, member: str, generation: int, now: float
) -> tuple[PoolState, list[Action]]:
    message = f"{member} is not a member of this pool"
    last = LastSwap(
        from_=state.resident,
        to=member,
        generation=generation,
        start=now,
        duration=0.0,
        outcome=Outcome.FAILED,
        reason=NOT_A_MEMBER,
        message=message,
    )
    actions: list[Action] = [
        ClearRequest(generation),
        EmitEvent("Warning", NOT_A_MEMBER, message),
        RecordFailure(member, NOT_A_MEMBER),
    ]
    return replace(state, last_swap=last, answered=generation), actions


def _call_off_reclaim(state: PoolState, now: float) -> PoolState:
    """The resident is busy (or asked for): it stays; look again a reclaimAfter later."""
    again = now + (state.config.reclaim_after or 0.0)
    return replace(state, swap=None, reclaim_at=again)


def _drain(state: PoolState, swap: Swap, now: float) -> tuple[PoolState, list[Action]]:
    request = state.request
    if swap.reclaim:
        wanted = request is not None and request.member is not None and not _answered(
            state, request)
        if wanted:
            return _call_off_reclaim(state, now), []
    newer = (
        request is not None
        and swap.generation is not None
        and request.generation > swap.generation
    )
    if request is not None and newer:
        if request.member is None or request.member == swap.from_:
            return _end(
                state, now, Outcome.WITHDRAWN, "Withdrawn",
                f"request {request.generation} withdrew the swap to {swap.to}",
                generation=request.generation,
            )
        if request.member in state.config.members and request.member != swap.to:
            swap = replace(swap, to=request.member, generation=request.generation)
            state = replace(state, swap=swap)
        elif request.member in state.config.members:
            swap = replace(swap, generation=request.generation)
            state = replace(state, swap=swap)
    assert swap.from_ is not None  # Draining always has an incumbent
    if state.observed is None or state.observed.count(swap.from_) == 0:
        return _begin_unloading(state, now)  # nothing runs that could be busy
    residency_end = _residency_end(state)
    preempts = state.config.outranks(swap.to, swap.from_)
    if residency_end is not None and now < residency_end and not preempts:
        served = f"{state.config.min_residency:g}s"
        return _defer(
            state, Deferral(MIN_RESIDENCY, f"{swap.from_} has not been resident {served} yet")
        )
    if swap.deferral is not None and swap.deferral.reason == MIN_RESIDENCY:
        swap = replace(swap, deferral=None)  # served, or preempted by a higher member
        state = replace(state, swap=swap)
    if swap.probe_in_flight or now < swap.next_probe:
        return state, []
    incumbent = swap.from_
    assert incumbent is not None  # Draining always has an incumbent
    return replace(state, swap=replace(swap, probe_in_flight=True)), [ProbeIdle(incumbent)]


def _residency_end(state: PoolState) -> float | None:
    if state.resident_since is None or state.config.min_residency <= 0:
        return None
    return state.resident_since + state.config.min_residency


def _defer(state: PoolState, deferral: Deferral) -> tuple[PoolState, list[Action]]:
    swap = state.swap
    assert swap is not None
    if swap.deferral == deferral:
        return state, []
    actions: list[Action] = []
    if swap.deferral is None or swap.deferral.reason != deferral.reason:
        actions = [
            RecordDeferral(deferral.reason),
            EmitEvent("Normal", "SwapDeferred", f"{deferral.reason}: {deferral.message}"),
        ]
    return replace(state, swap=replace(swap, deferral=deferral)), actions


def _begin_saving(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    """The incumbent found idle: save its slots first if it keeps them, else unload."""
    swap = state.swap
    assert swap is not None and swap.from_ is not None
    member = swap.from_
    if (member not in state.config.kv_caps
            or (state.observed or MemberPods()).count(member) == 0):
        return _begin_unloading(state, now)
    saves, actions = kv_phases.begin(state.saves, [member], state.config.kv_caps, now,
                                     swap.started + state.config.swap_budget)
    swap = replace(swap, phase=Phase.SAVING, phase_started=now,
                   durations=(*swap.durations, ("drain", now - swap.phase_started)),
                   deferral=None, probe_in_flight=False)
    return replace(state, swap=swap, saves=saves), list(actions)


def _begin_unloading(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    swap = state.swap
    assert swap is not None
    durations = swap.durations
    if swap.phase is Phase.DRAINING:
        durations += (("drain", now - swap.phase_started),)
    elif swap.phase is Phase.SAVING:
        durations += (("save", now - swap.phase_started),)
    swap = replace(
        swap,
        phase=Phase.UNLOADING,
        phase_started=now,
        durations=durations,
        deferral=None,
        probe_in_flight=False,
    )
    observed = state.observed or MemberPods()
    actions: list[Action] = [
        Scale(member, 0)
        for member in state.config.members
        if member != swap.to and (member == swap.from_ or observed.count(member) > 0)
        and member not in state.saves  # scaled once its slots are saved
    ]
    actions.append(Scale(swap.to, 1))  # staged: its gate is lifted once Loading
    return replace(state, swap=swap), actions


def _unload(state: PoolState, swap: Swap, now: float) -> tuple[PoolState, list[Action]]:
    observed = state.observed or MemberPods()
    others = [m for m in state.config.members if m != swap.to and observed.count(m) > 0]
    if others or observed.terminating.get(swap.to, 0) > 0:
        return state, []
    swap = replace(
        swap,
        phase=Phase.LOADING,
        phase_started=now,
        durations=(*swap.durations, ("unload", now - swap.phase_started)),
    )
    return replace(state, swap=swap, resident=None, resident_since=None), []


def _load(state: PoolState, swap: Swap, now: float) -> tuple[PoolState, list[Action]]:
    observed = state.observed or MemberPods()
    if swap.scheduled_at is None and (
        observed.scheduled.get(swap.to, 0) > 0 or observed.ready.get(swap.to, 0) > 0
    ):
        swap = replace(
            swap,
            scheduled_at=now,
            durations=(*swap.durations, ("schedule", now - swap.phase_started)),
        )
        state = replace(state, swap=swap)
    refused = observed.unschedulable.get(swap.to) if swap.scheduled_at is None else None
    actions: list[Action] = []
    if refused != swap.unschedulable:
        if refused is not None and swap.unschedulable is None:
            actions.append(EmitEvent("Warning", UNSCHEDULABLE, refused))
        swap = replace(swap, unschedulable=refused)
        state = replace(state, swap=swap)
    failed = observed.not_created.get(swap.to) if observed.count(swap.to) == 0 else None
    if failed != swap.not_created:
        if failed is not None and swap.not_created is None:
            actions.append(EmitEvent("Warning", FAILED_CREATE, failed))
        swap = replace(swap, not_created=failed)
        state = replace(state, swap=swap)
    failing = observed.failing.get(swap.to) if observed.ready.get(swap.to, 0) < 1 else None
    if failing != swap.failing:
        if failing is not None and swap.failing is None:
            actions.append(EmitEvent("Warning", *failing))
        swap = replace(swap, failing=failing)
        state = replace(state, swap=swap)
    if observed.ready.get(swap.to, 0) < 1:
        return state, actions
    assert swap.scheduled_at is not None  # set above at the latest: a Ready pod was placed
    swap = replace(swap, durations=(*swap.durations, ("load", now - swap.scheduled_at)))
    config = state.config
    if config.restores(swap.to):
        restores, restoring = kv_phases.begin(state.restores, [swap.to], config.kv_caps, now,
                                         None, restore=True)
        swap = replace(swap, phase=Phase.RESTORING, phase_started=now)
        return replace(state, swap=swap, restores=restores), [*actions, *restoring]
    state, more = _complete(replace(state, swap=swap), swap, now)
    return state, actions + more


def _complete(state: PoolState, swap: Swap, now: float) -> tuple[PoolState, list[Action]]:
    """The target is Ready (and its slots restored): it is resident."""
    actions: list[Action] = []
    duration = now - swap.started
    last = LastSwap(
        from_=swap.from_,
        to=swap.to,
        generation=swap.generation,
        start=swap.started,
        duration=duration,
        outcome=Outcome.SUCCEEDED,
        phases=swap.durations,
    )
    message = f"{swap.to} is resident (from {swap.from_ or '(none)'}, {duration:.1f}s)"
    actions += [
        EmitEvent("Normal", "SwapCompleted", message),
        RecordSwap(swap.from_, swap.to, duration, swap.durations),
    ]
    new = replace(
        state,
        swap=None,
        resident=swap.to,
        resident_since=now,
        last_swap=last,
        answered=max(state.answered, swap.generation or 0),
    )
    return new, actions


def _abandon(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    swap = state.swap
    assert swap is not None
    budget = state.config.swap_budget
    if swap.phase is Phase.DRAINING:
        why = swap.deferral.reason if swap.deferral else "draining"
        message = f"{swap.from_} not drained within swapBudget {budget:g}s ({why})"
    elif swap.phase is Phase.SAVING:
        message = f"{swap.from_}'s slots not saved within swapBudget {budget:g}s"
    elif swap.unschedulable is not None:
        message = (f"{swap.to} not Ready within swapBudget {budget:g}s "
                   f"({UNSCHEDULABLE}: {swap.unschedulable})")
    elif swap.not_created is not None:
        message = (f"{swap.to} not Ready within swapBudget {budget:g}s "
                   f"({FAILED_CREATE}: {swap.not_created})")
    elif swap.failing is not None:
        message = (f"{swap.to} not Ready within swapBudget {budget:g}s "
                   f"({swap.failing[0]}: {swap.failing[1]})")
    else:
        message = f"{swap.to} not Ready within swapBudget {budget:g}s"
    return _end(state, now, Outcome.ABANDONED, SWAP_BUDGET_EXCEEDED, message)


def _end(
    state: PoolState,
    now: float,
    outcome: Outcome,
    reason: str,
    message: str,
    generation: int | None = None,
) -> tuple[PoolState, list[Action]]:
    """Finish a swap that did not succeed: scale the target back, answer the request."""
    swap = state.swap
    assert swap is not None
    answered = generation if generation is not None else swap.generation
    last = LastSwap(
        from_=swap.from_,
        to=swap.to,
        generation=answered,
        start=swap.started,
        duration=now - swap.started,
        outcome=outcome,
        reason=reason,
        message=message,
    )
    actions: list[Action] = []
    if swap.phase not in HOLDING:
        actions.append(Scale(swap.to, 0))
    request = state.request
    if (
        outcome is not Outcome.WITHDRAWN
        and swap.generation is not None
        and request is not None
        and request.generation == swap.generation
        and request.member is not None
    ):
        actions.append(ClearRequest(swap.generation))
    if outcome is Outcome.WITHDRAWN:
        actions.append(EmitEvent("Normal", "SwapWithdrawn", message))
    else:
        actions += [
            EmitEvent("Warning", f"Swap{outcome.value}", f"{reason}: {message}"),
            RecordFailure(swap.to, reason),
        ]
    new = replace(state, swap=None, last_swap=last, answered=max(state.answered, answered or 0))
    if swap.phase not in HOLDING:
        new = replace(new, resident=None, resident_since=None)
    return new, actions


# idleUnloadAfter


def _activity_due_at(state: PoolState) -> float | None:
    activity = state.activity
    if activity is None or activity.probe_in_flight or activity.unsupported:
        return None
    return activity.next_probe


def _watch_activity(state: PoolState, now: float) -> tuple[PoolState, list[Action]]:
    """With no swap to make: probe the resident for activity when it is time."""
    resident = state.resident
    ready = state.observed is not None and state.observed.ready.get(resident or "", 0) > 0
    if state.config.idle_unload_after is None or resident is None or not ready:
        if state.activity is not None and (resident is None
                                           or state.config.idle_unload_after is None):
            return replace(state, activity=None), []
        return state, []
    activity = state.activity
    if activity is None or activity.member != resident:
        # the window starts now: a reconciler that starts again waits it out in full
        activity = Activity(resident, None, active_at=now, next_probe=now)
    if activity.probe_in_flight or activity.unsupported or now < activity.next_probe:
        return replace(state, activity=activity), []
    activity = replace(activity, probe_in_flight=True)
    return replace(state, activity=activity), [ProbeActivity(resident)]


def _activity_result(
    state: PoolState, event: ActivityResult, now: float
) -> tuple[PoolState, list[Action]]:
    activity = state.activity
    if (activity is None or not activity.probe_in_flight or activity.member != event.member
            or state.resident != event.member or state.swap is not None):
        return state, []  # an answer to a question no longer asked
    after = state.config.idle_unload_after
    activity = replace(activity, probe_in_flight=False,
                       next_probe=now + state.config.activity_interval)
    if event.verdict is Verdict.UNSUPPORTED:
        message = (f"{event.member} can never be probed for activity, so idleUnloadAfter "
                   f"leaves it resident")
        if event.detail:
            message += f": {event.detail}"
        activity = replace(activity, unsupported=True)
        return replace(state, activity=activity), [
            EmitEvent("Warning", IDLE_UNLOAD_UNSUPPORTED, message)]
    if event.verdict is Verdict.FAILED:
        # fail closed: what could not be seen counts as activity, a full window again
        return replace(state, activity=replace(activity, active_at=now)), []
    if event.verdict is Verdict.BUSY:
        activity = replace(activity, mark=event.mark, active_at=now)
        return replace(state, activity=activity), []
    first = activity.mark is None
    served = not first and event.mark != activity.mark
    activity = replace(activity, mark=event.mark, active_at=now if served else activity.active_at)
    idle_for = now - activity.active_at
    if first or served or after is None or idle_for < after:
        return replace(state, activity=activity), []
    message = (f"{event.member} served nothing for {idle_for:.0f}s (idleUnloadAfter "
               f"{after:g}s): unloaded, the pool is Cold until a request comes")
    saves, saving = kv_phases.begin(state.saves, [event.member], state.config.kv_caps, now,
                                    None)
    new = replace(state, resident=None, resident_since=None, activity=None,
                  idle_unloaded=IdleUnload(event.member, now, idle_for), saves=saves)
    scale: list[Action] = [] if event.member in saves else [Scale(event.member, 0)]
    return new, [*saving, *scale, EmitEvent("Normal", IDLE_UNLOADED, message),
                 RecordIdleUnload(event.member)]
