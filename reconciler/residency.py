"""A pool with a memory budget, as a pure state machine: residency is a set.

A ModelPool with `gpuMemory` holds as many members at once as their footprints fit in
that budget. This module decides, from what the reconciler observed (the spec, the
routers' request, the members' pods, the probes' answers) and the time it is given,
which members to load, which to evict for them, and when. It performs none of it: `step`
returns the new state and a list of actions, which the shell executes as it executes
those of `reconciler.swap` (the exclusive pool, whose observation events, actions,
verdicts and reasons this module shares). No awaits, no clock reads, no I/O.

The rules (the policies' meaning for a set: docs/api.md, "Pools with a memory budget"):

- The budget: a member's footprint counts from the moment the pool wants it (resident,
  or the target of a load once scaled to 1) and for as long as any pod of it exists,
  starting, running or terminating (a terminating pod still holds its memory). A load
  is released to the scheduler only while all of that stays within `gpuMemory`, and a
  member's pods are released only while none of its pods is terminating (a replacement
  pod waits for the one it replaces). Nothing is ever scaled up while it still has a pod.
- A request for a member that fits beside the members that stay (the residents and the
  loads under way; pods on their way out only delay it) is loaded at once: scaled to 1,
  released once the room is there, nobody drained. A request for a resident is answered
  at once. A footprint larger than the budget is rejected (`OverBudget`), a name that is
  no member too (`NotAMember`); the request is cleared either way.
- One that does not fit makes room: it drains victims among the residents. The order is
  least recently used first (last used: the last request seen for it, the last change
  of its activity mark or activity probe that found it busy, or when it became
  resident). A member inside its `minResidency` is never a victim unless the target
  outranks it by `priority`. The victims are the fewest that make room, taken in that
  order: going through the residents least recently used first, each is taken unless
  taking it would need more victims than the fewest possible. Members whose latest idle
  or activity answer was busy or failed are passed over while a plan without them makes
  room (even one with more victims); only if none does is the plan taken with them and
  the load deferred (`PodsBusy`, `IdleCheckFailed`) until they are idle.
- Draining: each victim is probed for idleness (fail closed). An answer counts for one
  probe interval; the victims are evicted together once every one of them has an idle
  answer that fresh and none has a probe in flight. A member that can never be probed
  is no victim; if only it could make room the load fails (`IdleProbeUnsupported`).
  With no plan the load waits: `MinResidency` while protected members alone could make
  room, `WaitingForRoom` while the room is held by loads under way.
- Evicting: the victims are scaled to 0 (an `Evicted` Event and a `RecordEviction` each,
  naming the target), the target is scaled to 1 once its own old pods are gone (created
  gated), and released once the budget holds with it, that is once enough of the
  victims' pods are gone. The load then waits for it to be Ready: it is resident.
- Saving: victims that keep their KV cache (`spec.kvCache.persist`) are saved before
  they are scaled to 0, and so is a member unloaded for idleness; they are no longer
  residents but run until saved, and the load waits in `Saving` until its victims are.
  A restore follows a load once its target is Ready (`Restoring`), before it is
  resident (`reconciler.kv_phases`, shared with the exclusive pool).
- The whole load is bounded by `swapBudget` from its start: past it the load is
  abandoned, its target scaled back to 0 and its request cleared by compare-and-swap.
  Victims already evicted stay unloaded. A load Restoring is bounded by its restore's
  cap instead (its target is Ready).
- A newer request supersedes a load still draining: it withdraws it when it names
  nobody or a resident, and otherwise replaces it (the victims are chosen again for the
  new target). A load past its drain is never withdrawn; several loads may be under way
  at once (at most one draining), each with its own budget.
- The default, under `sticky` and `fair`: loaded when nothing is resident or loading and
  no member was unloaded for idleness since (a Cold pool). Under `reclaim`: kept
  resident whenever it fits, loaded at once when it does; when it does not, members
  other than the default unused for `reclaimAfter` are drained to make room for it
  (LRU, fewest, as above), and any busy answer calls that off for another
  `reclaimAfter`, as any request does.
- `idleUnloadAfter`: each resident is probed for activity on its own, and unloaded on
  its own once it served nothing that long; the default is not loaded in its place, nor
  is an idle-unloaded default reloaded by `reclaim` before it is asked for. Residents
  are probed for activity also without `idleUnloadAfter` (every 15 s) where the order
  of eviction or `reclaim` needs it: when the members do not all fit together.
- `fair` with `maxWait` is the routers' (`sidecar.activator`): for a set it means that a
  waiter for a non-resident member that waited `maxWait` stops admission to the
  victims this machine names for it (`evicting`), not to the other residents.
- While the spec has a problem (a missing member, a member without a footprint)
  nothing starts and nothing is scaled; only the deadlines still apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from reconciler import kv_phases
from reconciler.kv_phases import (
    Pending,
    RecordKvAbandoned,
    RestoreResult,
    RestoreSlots,
    SaveResult,
    SaveSlots,
)
from reconciler.swap import (
    FAILED_CREATE,
    IDLE_CHECK_FAILED,
    IDLE_PROBE_UNSUPPORTED,
    IDLE_UNLOAD_UNSUPPORTED,
    IDLE_UNLOADED,
    MAX_ACTIVITY_INTERVAL,
    MIN_RESIDENCY,
    NOT_A_MEMBER,
    PODS_BUSY,
    SWAP_BUDGET_EXCEEDED,
    UNSCHEDULABLE,
    Activity,
    ActivityResult,
    ClearRequest,
    Deferral,
    EmitEvent,
    Event,
    IdleResult,
    IdleUnload,
    MemberPods,
    MembersObserved,
    Outcome,
    Phase,
    PoolConfig,
    ProbeActivity,
    ProbeIdle,
    Problem,
    RecordDeferral,
    RecordFailure,
    RecordIdleUnload,
    Request,
    RequestObserved,
    Scale,
    SpecObserved,
    Tick,
    Verdict,
)
from reconciler.swap import Action as SwapAction

# Reasons, beside those of `reconciler.swap`.
OVER_BUDGET = "OverBudget"
WAITING_FOR_ROOM = "WaitingForRoom"
INVALID_BUDGET = "InvalidBudget"
EVICTED = "Evicted"

_NOT_IDLE = (Verdict.BUSY, Verdict.FAILED)


@dataclass(frozen=True)
class ResidencyConfig(PoolConfig):
    """The swap's settings plus the budget: `gpu_memory` and each member's footprint,
    in bytes."""

    gpu_memory: int = 0
    footprints: Mapping[str, int] = field(default_factory=dict)

    def footprint(self, member: str) -> int:
        return self.footprints.get(member, 0)

    @property
    def usage_interval(self) -> float:
        """How often a resident is probed for activity: idleUnloadAfter's interval, else
        15 s (for the order of eviction alone)."""
        return self.activity_interval if self.idle_unload_after is not None else (
            MAX_ACTIVITY_INTERVAL)

    @property
    def watches_usage(self) -> bool:
        """Whether residents are probed for activity: idleUnloadAfter needs it, and so
        does the order of eviction or reclaim, where the members do not all fit."""
        fit = sum(self.footprint(m) for m in self.members) <= self.gpu_memory
        return self.idle_unload_after is not None or self.policy == "reclaim" or not fit

    def problem(self) -> Problem | None:
        """What makes the budget unusable (admission refuses it; this is the backstop)."""
        if self.gpu_memory <= 0:
            return Problem(INVALID_BUDGET, "the pool's gpuMemory must be positive")
        missing = [m for m in self.members if self.footprint(m) <= 0]
        if missing:
            return Problem(INVALID_BUDGET, "members without a gpuMemory footprint: "
                           + ", ".join(missing))
        return None


@dataclass(frozen=True)
class Resident:
    member: str
    since: float
    last_used: float


@dataclass(frozen=True)
class Load:
    """One member on its way in, with the residents evicted (or, while Draining, to be
    evicted) for it. Draining only when room must be made; a load that fits starts in
    Unloading, where it waits for its own old pods and the room, then Loading."""

    to: str
    generation: int | None  # the request generation served; None for the default
    phase: Phase
    started: float
    phase_started: float
    victims: tuple[str, ...] = ()
    staged: bool = False  # scaled to 1 (its pods exist, gated until Loading)
    # Draining: the latest idle or activity answer of each resident, and when.
    verdicts: Mapping[str, tuple[Verdict, float]] = field(default_factory=dict)
    probing: frozenset[str] = frozenset()
    unprobeable: frozenset[str] = frozenset()
    deferral: Deferral | None = None
    recheck_at: float | None = None  # Draining: when an answer goes stale or a wait ends
    reclaim: bool = False  # swapPolicy reclaim: called off by any busy answer or request
    scheduled_at: float | None = None
    durations: tuple[tuple[str, float], ...] = ()
    unschedulable: str | None = None
    not_created: str | None = None
    failing: tuple[str, str] | None = None


@dataclass(frozen=True)
class LastLoad:
    to: str
    generation: int | None
    start: float
    duration: float
    outcome: Outcome
    evicted: tuple[str, ...] = ()
    reason: str | None = None
    message: str | None = None
    phases: tuple[tuple[str, float], ...] = ()  # a completed load's, in order


@dataclass(frozen=True)
class ResidencyState:
    config: ResidencyConfig
    generation: int = 0
    problem: Problem | None = None
    request: Request | None = None
    observed: MemberPods | None = None  # None until the members' pods were seen once
    residents: Mapping[str, Resident] = field(default_factory=dict)
    loads: tuple[Load, ...] = ()
    last_load: LastLoad | None = None
    # The newest request generation answered (loaded, rejected, abandoned, withdrawn).
    answered: int = 0
    # swapPolicy reclaim: the earliest time a reclaim is tried again after a busy answer.
    reclaim_at: float | None = None
    activity: Mapping[str, Activity] = field(default_factory=dict)
    # Members unloaded by idleUnloadAfter and not loaded since.
    idle_unloads: Mapping[str, IdleUnload] = field(default_factory=dict)
    # Saves and restores under way (`kv_phases`), by member.
    saves: Mapping[str, Pending] = field(default_factory=dict)
    restores: Mapping[str, Pending] = field(default_factory=dict)


# Actions, beside those of `reconciler.swap`


@dataclass(frozen=True)
class RecordEviction:
    """`member` was evicted to make room for `for_`."""

    member: str
    for_: str


@dataclass(frozen=True)
class RecordLoad:
    """`to` became resident, `evicted` having made room for it (empty: it fitted)."""

    to: str
    evicted: tuple[str, ...]
    duration: float
    phases: tuple[tuple[str, float], ...]


Action = SwapAction | RecordEviction | RecordLoad


# The shell's view


@dataclass(frozen=True)
class ResidentView:
    """One line of status: a resident, since when, its footprint and when last used."""

    name: str
    since: float
    footprint: int
    last_used: float


def initial_state(config: ResidencyConfig) -> ResidencyState:
    return ResidencyState(config=config)


def step(state: ResidencyState, event: Event, now: float) -> tuple[ResidencyState, list[Action]]:
    """Apply one observation, then decide; returns the new state and what to do."""
    state, actions = _apply(state, event, now)
    # A decision can open the next one at once (nothing to drain, a target already
    # Ready); iterate to a fixed point, bounded because each pass advances some load.
    for _ in range(8 + 4 * len(state.config.members)):
        new, more = _decide(state, now)
        actions += more
        if new == state:
            break
        state = new
    return state, actions


def next_wakeup(state: ResidencyState) -> float | None:
    """When the shell must step the pool again with a Tick, absent other events."""
    budget = state.config.swap_budget
    times = [load.started + budget for load in state.loads]
    times += [load.recheck_at for load in state.loads if load.recheck_at is not None]
    reclaim = _reclaim_due_at(state)
    if reclaim is not None:
        times.append(reclaim)
    times += [a.next_probe for a in state.activity.values()
              if not a.probe_in_flight and not a.unsupported]
    kv = kv_phases.next_deadline(state.saves, state.restores)
    if kv is not None:
        times.append(kv)
    return min(times, default=None)


def desired_replicas(state: ResidencyState) -> dict[str, int] | None:
    """Each member's replicas as the pool wants them; None while the spec has a problem
    (nothing is scaled then: the shell keeps whatever runs)."""
    if state.problem is not None:
        return None
    wanted = dict.fromkeys(state.config.members, 0)
    for member in _wanted(state):
        if member in wanted:
            wanted[member] = 1
    return wanted


def released(state: ResidencyState) -> frozenset[str]:
    """The members whose pods the scheduler may place (the shell lifts their gate): the
    residents and the loads in Loading, each only while none of its pods terminates.
    Nobody while the spec has a problem."""
    if state.problem is not None:
        return frozenset()
    observed = state.observed or MemberPods()
    holders = set(state.residents) | {x.to for x in state.loads
                                      if x.phase in (Phase.LOADING, Phase.RESTORING)}
    return frozenset(m for m in holders & set(state.config.members)
                     if observed.terminating.get(m, 0) == 0)


def residents_of(state: ResidencyState) -> tuple[ResidentView, ...]:
    """The residents for status, longest resident first."""
    config = state.config
    return tuple(
        ResidentView(r.member, r.since, config.footprint(r.member), r.last_used)
        for r in sorted(state.residents.values(), key=lambda r: (r.since, r.member))
    )


def used(state: ResidencyState) -> int:
    """The budget taken: members wanted or promised (loads under way), and members that
    still have pods."""
    return _footprints(state.config, _holding(state))


def room_left(state: ResidencyState) -> int:
    """What of the budget no member takes or is promised (status's room left)."""
    return state.config.gpu_memory - used(state)


def lru(state: ResidencyState) -> tuple[str, ...]:
    """The residents, least recently used first: the order victims are taken in."""
    ordered = sorted(state.residents.values(), key=lambda r: (r.last_used, r.since, r.member))
    return tuple(r.member for r in ordered)


def evicting(state: ResidencyState) -> tuple[str, tuple[str, ...]] | None:
    """The load that is draining victims, and the victims it drains: what a router under
    swapPolicy fair stops admitting to once a waiter waited maxWait. None while no load
    drains, or a reclaim check does (not a load until the victims were found idle)."""
    load = _draining(state)
    if load is None or load.reclaim or not load.victims:
        return None
    return load.to, load.victims


def visible_loads(state: ResidencyState) -> tuple[Load, ...]:
    """The loads as status shows them: a reclaim check is not one until its victims
    were found idle."""
    return tuple(x for x in state.loads if not (x.reclaim and x.phase is Phase.DRAINING))


def phase_of(state: ResidencyState) -> str:
    """The pool's phase: Cold, Ready, Swapping or Degraded."""
    if state.problem is not None and not state.problem.pending:
        return "Degraded"
    if visible_loads(state):
        return "Swapping"
    if not state.residents:
        return "Cold"
    observed = state.observed
    if observed is not None and any(observed.ready.get(m, 0) < 1 for m in state.residents):
        return "Degraded"
    return "Ready"


# Accounting


def _footprints(config: ResidencyConfig, members: Iterable[str]) -> int:
    return sum(config.footprint(m) for m in members)


def _wanted(state: ResidencyState) -> set[str]:
    """Members the pool runs at 1: the residents, the staged loads and the members whose
    slots are being saved."""
    return set(state.residents) | {x.to for x in state.loads if x.staged} | set(state.saves)


def _holding(state: ResidencyState) -> set[str]:
    """Members whose footprint counts now: wanted, promised (a load past its drain, even
    before it is staged) or with pods."""
    observed = state.observed or MemberPods()
    promised = {x.to for x in state.loads if x.phase is not Phase.DRAINING}
    present = {m for m, n in observed.pods.items() if n > 0}
    return _wanted(state) | promised | present


def _need(state: ResidencyState, member: str) -> int:
    """How much more room `member` needs than the members that stay leave it (residents
    and loads past their drain; pods on their way out do not count: they only delay)."""
    stay = set(state.residents) | {x.to for x in state.loads if x.phase is not Phase.DRAINING}
    stay.discard(member)
    config = state.config
    return config.footprint(member) + _footprints(config, stay) - config.gpu_memory


def _fewest(candidates: Sequence[tuple[str, int]], need: int) -> tuple[str, ...] | None:
    """The fewest of `candidates` (least recently used first) whose footprints add up to
    `need`, taken in that order: each is taken unless that would need more victims than
    the fewest possible. None if all of them together do not make room."""
    if need <= 0:
        return ()
    sizes = sorted((f for _, f in candidates), reverse=True)
    total, fewest = 0, 0
    for size in sizes:
        total += size
        fewest += 1
        if total >= need:
            break
    else:
        return None
    chosen: list[str] = []
    freed = 0
    for i, (member, size) in enumerate(candidates):
        left = fewest - len(chosen)
        if left == 0:
            break
        best_rest = sorted((f for _, f in candidates[i + 1:]), reverse=True)[:left - 1]
        if freed + size + sum(best_rest) >= need:
            chosen.append(member)
            freed += size
    return tuple(chosen)


# Applying observations


def _apply(state: ResidencyState, event: Event, now: float
           ) -> tuple[ResidencyState, list[Action]]:
    if isinstance(event, SpecObserved):
        config = event.config
        assert isinstance(config, ResidencyConfig), "a budgeted pool needs a ResidencyConfig"
        problem = event.problem or config.problem()
        actions: list[Action] = []
        if problem is not None and not problem.pending and problem != state.problem:
            actions.append(EmitEvent("Warning", problem.reason, problem.message))
        elif problem is None and state.problem is not None and not state.problem.pending:
            actions.append(EmitEvent("Normal", "SpecValid", "the pool's spec is valid again"))
        members = set(config.members)
        new = replace(
            state,
            config=config,
            generation=event.generation,
            problem=problem,
            residents={m: r for m, r in state.residents.items() if m in members},
            activity={m: a for m, a in state.activity.items() if m in members},
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
    assert isinstance(event, Tick)
    return state, []


def _scale_saved(state: ResidencyState, members: Iterable[str]) -> list[Action]:
    """Scale to 0 the members whose save ended and whom the pool no longer wants."""
    if state.problem is not None:
        return []
    wanted = _wanted(state)
    return [Scale(m, 0) for m in members if m in state.config.members and m not in wanted]


def _expire_kv(state: ResidencyState, now: float) -> tuple[ResidencyState, list[Action]]:
    """Saves and restores past their deadline: abandoned, told and counted."""
    expired = kv_phases.expire_both(state.saves, state.restores, now)
    if expired is None:
        return state, []
    actions: list[Action] = []
    for gone in expired.abandoned:
        actions += [gone.record, EmitEvent("Warning", gone.reason, gone.message)]
    state = replace(state, saves=expired.saves, restores=expired.restores)
    return state, actions + _scale_saved(state, expired.late_saves)


def _idle_result(state: ResidencyState, event: IdleResult, now: float
                 ) -> tuple[ResidencyState, list[Action]]:
    load = _draining(state)
    if load is None or event.member not in state.residents:
        return state, []  # an answer to a question no longer asked
    load = replace(load, probing=load.probing - {event.member})
    if load.reclaim and event.verdict is not Verdict.IDLE:
        return _call_off_reclaim(state, load, now), []
    if event.verdict is Verdict.UNSUPPORTED:
        load = replace(load, unprobeable=load.unprobeable | {event.member})
    else:
        load = replace(load, verdicts={**load.verdicts, event.member: (event.verdict, now)})
    return _put(state, load), []


# Deciding


def _decide(state: ResidencyState, now: float) -> tuple[ResidencyState, list[Action]]:
    if state.observed is None:
        return state, []
    state, actions = _expire_kv(state, now)
    for load in state.loads:
        if (now >= load.started + state.config.swap_budget
                and load.phase is not Phase.RESTORING):
            if load.reclaim and load.phase is Phase.DRAINING:
                state = _call_off_reclaim(state, load, now)
            else:
                state, more = _abandon(state, load, now)
                actions += more
    if state.problem is not None:
        return state, actions
    state, more = _on_request(state, now)
    actions += more
    for load in state.loads:
        if load.phase is Phase.DRAINING:
            state, more = _drain(state, load, now)
        elif load.phase is Phase.SAVING:
            state, more = _saved(state, load, now)
        elif load.phase is Phase.UNLOADING:
            state, more = _unload(state, load, now)
        elif load.phase is Phase.RESTORING:
            state, more = _restored(state, load, now)
        else:
            state, more = _load(state, load, now)
        actions += more
    state, more = _maybe_default(state, now)
    actions += more
    state, more = _watch_activity(state, now)
    return state, actions + more


def _draining(state: ResidencyState) -> Load | None:
    return next((x for x in state.loads if x.phase is Phase.DRAINING), None)


def _load_for(state: ResidencyState, member: str) -> Load | None:
    return next((x for x in state.loads if x.to == member), None)


def _put(state: ResidencyState, load: Load) -> ResidencyState:
    """`state` with `load` in place of the load of its target (or added)."""
    loads = tuple(load if x.to == load.to else x for x in state.loads)
    if load.to not in {x.to for x in state.loads}:
        loads += (load,)
    return replace(state, loads=loads)


def _drop(state: ResidencyState, load: Load) -> ResidencyState:
    return replace(state, loads=tuple(x for x in state.loads if x.to != load.to))


def _on_request(state: ResidencyState, now: float) -> tuple[ResidencyState, list[Action]]:
    request = state.request
    if request is None or request.generation <= state.answered:
        return state, []
    member = request.member
    draining = _draining(state)
    if draining is not None and draining.to != member and (
            draining.generation is None or request.generation > draining.generation):
        if draining.reclaim:
            state = _call_off_reclaim(state, draining, now)
        elif member is None or member in state.residents:
            return _end(state, draining, now, Outcome.WITHDRAWN, "Withdrawn",
                        f"request {request.generation} withdrew the load of {draining.to}",
                        generation=request.generation)
        else:
            state = _drop(state, draining)  # replaced by the load of the newer request
    if member is None:
        return state, []
    config = state.config
    if member not in config.members:
        return _reject(state, request, now, NOT_A_MEMBER,
                       f"{member} is not a member of this pool")
    if config.footprint(member) > config.gpu_memory:
        return _reject(state, request, now, OVER_BUDGET,
                       f"{member} needs {config.footprint(member)} bytes, more than the "
                       f"pool's gpuMemory {config.gpu_memory}")
    if member in state.residents:
        resident = replace(state.residents[member], last_used=now)
        return replace(state, residents={**state.residents, member: resident},
                       answered=request.generation), []
    load = _load_for(state, member)
    if load is not None:
        if load.generation != request.generation:
            state = _put(state, replace(load, generation=request.generation, reclaim=False))
        return state, []
    return _start(state, member, request.generation, now)


def _reject(state: ResidencyState, request: Request, now: float, reason: str, message: str
            ) -> tuple[ResidencyState, list[Action]]:
    assert request.member is not None
    last = LastLoad(to=request.member, generation=request.generation, start=now,
                    duration=0.0, outcome=Outcome.FAILED, reason=reason, message=message)
    actions: list[Action] = [
        ClearRequest(request.generation),
        EmitEvent("Warning", reason, message),
        RecordFailure(request.member, reason),
    ]
    return replace(state, last_load=last, answered=request.generation), actions


def _start(state: ResidencyState, member: str, generation: int | None, now: float,
           reclaim: bool = False) -> tuple[ResidencyState, list[Action]]:
    fits = _need(state, member) <= 0
    load = Load(to=member, generation=generation,
                phase=Phase.UNLOADING if fits else Phase.DRAINING,
                started=now, phase_started=now, reclaim=reclaim)
    state = _put(state, load)
    state = replace(state, idle_unloads={m: u for m, u in state.idle_unloads.items()
                                         if m != member})
    # A member that runs though the pool wants none of it (scaled by hand, or left over
    # from before a restart) holds room nobody accounted for: it goes.
    observed = state.observed or MemberPods()
    wanted = _wanted(state)
    actions: list[Action] = [
        Scale(m, 0) for m in state.config.members
        if m not in wanted and observed.count(m) > observed.terminating.get(m, 0)
    ]
    if reclaim:
        return state, actions  # announced only once its victims were found idle
    why = f"request {generation}" if generation is not None else "the pool's default"
    how = "it fits" if fits else "making room"
    actions.append(EmitEvent("Normal", "SwapStarted", f"loading {member} for {why} ({how})"))
    if fits:
        state, more = _unload(state, load, now)
        actions += more
    return state, actions


def _maybe_default(state: ResidencyState, now: float) -> tuple[ResidencyState, list[Action]]:
    config = state.config
    default = config.default
    request = state.request
    if (default is None or default not in config.members
            or config.footprint(default) > config.gpu_memory
            or default in state.residents or _load_for(state, default) is not None
            or default in state.idle_unloads
            or (request is not None and request.member is not None
                and request.generation > state.answered)):
        return state, []
    if config.policy == "reclaim":
        if _need(state, default) <= 0:
            return _start(state, default, None, now)
        due = _reclaim_due_at(state)
        if due is not None and now >= due and _draining(state) is None:
            return _start(state, default, None, now, reclaim=True)
        return state, []
    if not state.residents and not state.loads and not state.idle_unloads:
        return _start(state, default, None, now)
    return state, []


def _reclaim_due_at(state: ResidencyState) -> float | None:
    """When swapPolicy reclaim can next make room for the default: once members other
    than it, unused for reclaimAfter, could make it."""
    config = state.config
    default = config.default
    if (config.policy != "reclaim" or config.reclaim_after is None or default is None
            or default not in config.members or default in state.residents
            or default in state.idle_unloads or _load_for(state, default) is not None
            or state.problem is not None):
        return None
    need = _need(state, default)
    if need <= 0:
        return None
    freed = 0
    for unused_at, member in sorted((r.last_used + config.reclaim_after, m)
                                    for m, r in state.residents.items() if m != default):
        freed += config.footprint(member)
        if freed >= need:
            return unused_at if state.reclaim_at is None else max(unused_at, state.reclaim_at)
    return None


def _call_off_reclaim(state: ResidencyState, load: Load, now: float) -> ResidencyState:
    """A busy answer or a request: the residents stay; look again a reclaimAfter later."""
    return replace(_drop(state, load), reclaim_at=now + (state.config.reclaim_after or 0.0))


def _protected(state: ResidencyState, member: str, target: str, now: float) -> float | None:
    """The end of `member`'s minResidency if it protects it from `target` now, else None."""
    config = state.config
    if config.min_residency <= 0 or config.outranks(target, member):
        return None
    end = state.residents[member].since + config.min_residency
    return end if now < end else None


def _verdict(state: ResidencyState, load: Load, member: str, now: float) -> Verdict | None:
    """What is known of `member`'s idleness now: an answer at most a probe interval old,
    idle if it has no pod at all, else None."""
    if (state.observed or MemberPods()).count(member) == 0:
        return Verdict.IDLE
    answer = load.verdicts.get(member)
    if answer is None or now >= answer[1] + state.config.probe_interval:
        return None
    return answer[0]


def _drain(state: ResidencyState, load: Load, now: float) -> tuple[ResidencyState, list[Action]]:
    config = state.config
    need = _need(state, load.to)
    if need <= 0:
        return _commit(state, load, (), now)  # room was made meanwhile (an idle unload)
    order = [m for m in lru(state) if m != load.to]
    if load.reclaim:
        after = config.reclaim_after or 0.0
        order = [m for m in order if m != config.default
                 and state.residents[m].last_used + after <= now]
    sized = {m: config.footprint(m) for m in order}

    def plan(members: Iterable[str]) -> tuple[str, ...] | None:
        return _fewest([(m, sized[m]) for m in members], need)

    probeable = [m for m in order if m not in load.unprobeable]
    ends = {m: end for m in probeable if (end := _protected(state, m, load.to, now)) is not None}
    free = [m for m in probeable if m not in ends]
    verdicts = {m: _verdict(state, load, m, now) for m in free}
    victims = plan(m for m in free if verdicts[m] not in _NOT_IDLE)
    if victims is None:
        victims = plan(free)
    if victims is None:
        if load.reclaim:
            return _call_off_reclaim(state, load, now), []
        if plan(probeable) is not None:
            load = replace(load, victims=(), recheck_at=min(ends.values()))
            names = ", ".join(sorted(ends))
            return _defer(state, load, Deferral(
                MIN_RESIDENCY, f"{names} not resident {config.min_residency:g}s yet"))
        if load.unprobeable and plan(order) is not None:
            names = ", ".join(sorted(load.unprobeable))
            return _end(state, load, now, Outcome.FAILED, IDLE_PROBE_UNSUPPORTED,
                        f"{names} can never be probed for idleness")
        load = replace(load, victims=(), recheck_at=None)
        return _defer(state, load, Deferral(
            WAITING_FOR_ROOM, f"{load.to} needs {need} bytes more than the residents "
                              f"that may go can free"))
    in_flight = load.probing | {m for m, a in state.activity.items() if a.probe_in_flight}
    if all(verdicts[m] is Verdict.IDLE and m not in in_flight for m in victims):
        return _commit(state, load, victims, now)
    probes = [m for m in victims if verdicts[m] is None and m not in load.probing]
    stale = [load.verdicts[m][1] + config.probe_interval for m in victims
             if verdicts[m] is not None and m in load.verdicts]
    load = replace(load, victims=victims, probing=load.probing | set(probes),
                   recheck_at=min(stale, default=None))
    actions: list[Action] = [ProbeIdle(m) for m in probes]
    busy = [m for m in victims if verdicts[m] is Verdict.BUSY]
    failed = [m for m in victims if verdicts[m] is Verdict.FAILED]
    if busy:
        deferral: Deferral | None = Deferral(PODS_BUSY, f"{', '.join(busy)} serving requests")
    elif failed:
        deferral = Deferral(IDLE_CHECK_FAILED, f"idle check of {', '.join(failed)} failed")
    elif load.deferral is not None and load.deferral.reason in (MIN_RESIDENCY,
                                                                WAITING_FOR_ROOM):
        deferral = None  # that wait is over; the victims are being probed
        load = replace(load, deferral=None)
    else:
        deferral = None
    if deferral is not None:
        state, more = _defer(state, load, deferral)
        return state, actions + more
    return _put(state, load), actions


def _defer(state: ResidencyState, load: Load, deferral: Deferral
           ) -> tuple[ResidencyState, list[Action]]:
    actions: list[Action] = []
    if load.deferral is None or load.deferral.reason != deferral.reason:
        actions = [RecordDeferral(deferral.reason),
                   EmitEvent("Normal", "SwapDeferred", f"{deferral.reason}: {deferral.message}")]
    return _put(state, replace(load, deferral=deferral)), actions


def _commit(state: ResidencyState, load: Load, victims: tuple[str, ...], now: float
            ) -> tuple[ResidencyState, list[Action]]:
    """Evict `victims` (found idle) for `load`, and go on to stage its target."""
    why = f"request {load.generation}" if load.generation is not None else "the default"
    actions: list[Action] = []
    if load.reclaim:
        after = state.config.reclaim_after or 0.0
        actions.append(EmitEvent("Normal", "SwapStarted",
                                 f"loading {load.to}: reclaimed after {after:g}s"))
    observed = state.observed or MemberPods()
    running = [v for v in victims if observed.count(v) > 0]
    saves, saving = kv_phases.begin(state.saves, running, state.config.kv_caps, now,
                                    load.started + state.config.swap_budget)
    actions += saving
    for victim in victims:
        if victim not in saves:  # else scaled once its slots are saved
            actions.append(Scale(victim, 0))
        actions += [
            EmitEvent("Normal", EVICTED, f"{victim} evicted for {load.to} ({why})"),
            RecordEviction(victim, load.to),
        ]
    phase = Phase.SAVING if any(v in saves for v in victims) else Phase.UNLOADING
    load = replace(load, phase=phase, phase_started=now, victims=victims,
                   durations=(*load.durations, ("drain", now - load.phase_started)),
                   verdicts={}, probing=frozenset(), deferral=None, recheck_at=None)
    state = replace(
        _put(state, load),
        residents={m: r for m, r in state.residents.items() if m not in victims},
        activity={m: a for m, a in state.activity.items() if m not in victims},
        saves=saves,
    )
    if phase is Phase.SAVING:
        return state, actions
    state, more = _unload(state, load, now)
    return state, actions + more


def _saved(state: ResidencyState, load: Load, now: float
           ) -> tuple[ResidencyState, list[Action]]:
    """Saving: on to Unloading once none of the load's victims is being saved."""
    if any(v in state.saves for v in load.victims):
        return state, []
    load = replace(load, phase=Phase.UNLOADING, phase_started=now,
                   durations=(*load.durations, ("save", now - load.phase_started)))
    return _unload(_put(state, load), load, now)


def _restored(state: ResidencyState, load: Load, now: float
              ) -> tuple[ResidencyState, list[Action]]:
    """Restoring: resident once the target's restore answered or passed its cap."""
    if load.to in state.restores:
        return state, []
    load = replace(load, durations=(*load.durations, ("restore", now - load.phase_started)))
    return _resident(state, load, now)


def _unload(state: ResidencyState, load: Load, now: float) -> tuple[ResidencyState, list[Action]]:
    observed = state.observed or MemberPods()
    actions: list[Action] = []
    if not load.staged:
        if observed.count(load.to) > 0:
            return state, []  # its own old pods are still terminating
        load = replace(load, staged=True)
        state = _put(state, load)
        actions.append(Scale(load.to, 1))  # created gated: released once Loading
    config = state.config
    if (observed.terminating.get(load.to, 0) > 0
            or _footprints(config, _holding(state)) > config.gpu_memory):
        return state, actions
    load = replace(load, phase=Phase.LOADING, phase_started=now,
                   durations=(*load.durations, ("unload", now - load.phase_started)))
    return _put(state, load), actions


def _load(state: ResidencyState, load: Load, now: float) -> tuple[ResidencyState, list[Action]]:
    observed = state.observed or MemberPods()
    member = load.to
    actions: list[Action] = []
    if load.scheduled_at is None and (
            observed.scheduled.get(member, 0) > 0 or observed.ready.get(member, 0) > 0):
        load = replace(load, scheduled_at=now,
                       durations=(*load.durations, ("schedule", now - load.phase_started)))
    refused = observed.unschedulable.get(member) if load.scheduled_at is None else None
    if refused != load.unschedulable:
        if refused is not None and load.unschedulable is None:
            actions.append(EmitEvent("Warning", UNSCHEDULABLE, refused))
        load = replace(load, unschedulable=refused)
    failed = observed.not_created.get(member) if observed.count(member) == 0 else None
    if failed != load.not_created:
        if failed is not None and load.not_created is None:
            actions.append(EmitEvent("Warning", FAILED_CREATE, failed))
        load = replace(load, not_created=failed)
    failing = observed.failing.get(member) if observed.ready.get(member, 0) < 1 else None
    if failing != load.failing:
        if failing is not None and load.failing is None:
            actions.append(EmitEvent("Warning", *failing))
        load = replace(load, failing=failing)
    if observed.ready.get(member, 0) < 1:
        return _put(state, load), actions
    assert load.scheduled_at is not None  # set above at the latest: a Ready pod was placed
    load = replace(load, durations=(*load.durations, ("load", now - load.scheduled_at)))
    config = state.config
    if config.restores(member):
        restores, restoring = kv_phases.begin(state.restores, [member], config.kv_caps, now,
                                         None, restore=True)
        load = replace(load, phase=Phase.RESTORING, phase_started=now)
        return replace(_put(state, load), restores=restores), [*actions, *restoring]
    state, more = _resident(state, load, now)
    return state, actions + more


def _resident(state: ResidencyState, load: Load, now: float
              ) -> tuple[ResidencyState, list[Action]]:
    """The load's target is Ready (and its slots restored): it is resident."""
    member = load.to
    actions: list[Action] = []
    durations = load.durations
    duration = now - load.started
    last = LastLoad(to=member, generation=load.generation, start=load.started,
                    duration=duration, outcome=Outcome.SUCCEEDED, evicted=load.victims,
                    phases=durations)
    evicted = f"evicted {', '.join(load.victims)}" if load.victims else "nothing evicted"
    actions += [
        EmitEvent("Normal", "SwapCompleted", f"{member} is resident ({evicted}, {duration:.1f}s)"),
        RecordLoad(member, load.victims, duration, durations),
    ]
    new = replace(
        _drop(state, load),
        residents={**state.residents, member: Resident(member, now, now)},
        last_load=last,
        answered=max(state.answered, load.generation or 0),
        activity={m: a for m, a in state.activity.items() if m != member},
    )
    return new, actions


def _abandon(state: ResidencyState, load: Load, now: float) -> tuple[ResidencyState, list[Action]]:
    budget = state.config.swap_budget
    if load.phase is Phase.DRAINING:
        why = load.deferral.reason if load.deferral else "draining"
        victims = ", ".join(load.victims) or "no member"
        message = f"{victims} not drained for {load.to} within swapBudget {budget:g}s ({why})"
    elif load.phase is Phase.SAVING:
        message = (f"{', '.join(load.victims)} not saved for {load.to} within swapBudget "
                   f"{budget:g}s")
    elif load.unschedulable is not None:
        message = (f"{load.to} not Ready within swapBudget {budget:g}s "
                   f"({UNSCHEDULABLE}: {load.unschedulable})")
    elif load.not_created is not None:
        message = (f"{load.to} not Ready within swapBudget {budget:g}s "
                   f"({FAILED_CREATE}: {load.not_created})")
    elif load.failing is not None:
        message = (f"{load.to} not Ready within swapBudget {budget:g}s "
                   f"({load.failing[0]}: {load.failing[1]})")
    else:
        message = f"{load.to} not Ready within swapBudget {budget:g}s"
    return _end(state, load, now, Outcome.ABANDONED, SWAP_BUDGET_EXCEEDED, message)


def _end(state: ResidencyState, load: Load, now: float, outcome: Outcome, reason: str,
         message: str, generation: int | None = None) -> tuple[ResidencyState, list[Action]]:
    """Finish a load that did not succeed: scale its target back, answer the request."""
    answered = generation if generation is not None else load.generation
    last = LastLoad(to=load.to, generation=answered, start=load.started,
                    duration=now - load.started, outcome=outcome, evicted=load.victims
                    if load.phase is not Phase.DRAINING else (), reason=reason,
                    message=message)
    actions: list[Action] = []
    if load.staged:
        actions.append(Scale(load.to, 0))
    request = state.request
    if (outcome is not Outcome.WITHDRAWN and load.generation is not None
            and request is not None and request.generation == load.generation
            and request.member is not None):
        actions.append(ClearRequest(load.generation))
    if outcome is Outcome.WITHDRAWN:
        actions.append(EmitEvent("Normal", "SwapWithdrawn", message))
    else:
        actions += [EmitEvent("Warning", f"Swap{outcome.value}", f"{reason}: {message}"),
                    RecordFailure(load.to, reason)]
    new = replace(_drop(state, load), last_load=last,
                  answered=max(state.answered, answered or 0))
    return new, actions


# Activity: the order of eviction, reclaim and idleUnloadAfter


def _watch_activity(state: ResidencyState, now: float) -> tuple[ResidencyState, list[Action]]:
    config = state.config
    observed = state.observed or MemberPods()
    if not config.watches_usage:
        return (replace(state, activity={}) if state.activity else state), []
    activity = {m: a for m, a in state.activity.items() if m in state.residents}
    actions: list[Action] = []
    for member in sorted(state.residents):
        if observed.ready.get(member, 0) < 1:
            continue
        current = activity.get(member)
        if current is None:
            # the window starts now: a reconciler that starts again waits it out in full
            current = Activity(member, None, active_at=now, next_probe=now)
        if not current.probe_in_flight and not current.unsupported and now >= current.next_probe:
            current = replace(current, probe_in_flight=True)
            actions.append(ProbeActivity(member))
        activity[member] = current
    if activity == state.activity:
        return state, actions
    return replace(state, activity=activity), actions


def _activity_result(state: ResidencyState, event: ActivityResult, now: float
                     ) -> tuple[ResidencyState, list[Action]]:
    member = event.member
    activity = state.activity.get(member)
    if activity is None or not activity.probe_in_flight or member not in state.residents:
        return state, []  # an answer to a question no longer asked
    config = state.config
    draining = _draining(state)
    if draining is not None and event.verdict is not Verdict.UNSUPPORTED:
        # what a drain would ask: a busy answer here counts there too (fail closed)
        verdicts = {**draining.verdicts, member: (event.verdict, now)}
        state = _put(state, replace(draining, verdicts=verdicts))
    activity = replace(activity, probe_in_flight=False, next_probe=now + config.usage_interval)
    resident = state.residents[member]
    after = config.idle_unload_after
    actions: list[Action] = []
    if event.verdict is Verdict.UNSUPPORTED:
        activity = replace(activity, unsupported=True)
        if after is not None:
            message = (f"{member} can never be probed for activity, so idleUnloadAfter "
                       f"leaves it resident")
            if event.detail:
                message += f": {event.detail}"
            actions.append(EmitEvent("Warning", IDLE_UNLOAD_UNSUPPORTED, message))
        return _with_activity(state, activity), actions
    if event.verdict is Verdict.FAILED:
        # fail closed: what could not be seen counts as activity, a full window again
        return _with_activity(state, replace(activity, active_at=now)), []
    if event.verdict is Verdict.BUSY:
        state = _used(state, resident, now)
        return _with_activity(state, replace(activity, mark=event.mark, active_at=now)), []
    first = activity.mark is None
    served = not first and event.mark != activity.mark
    activity = replace(activity, mark=event.mark, active_at=now if served else activity.active_at)
    if served:
        state = _used(state, resident, now)
    idle_for = now - activity.active_at
    if first or served or after is None or idle_for < after:
        return _with_activity(state, activity), []
    message = (f"{member} served nothing for {idle_for:.0f}s (idleUnloadAfter {after:g}s): "
               f"unloaded until a request comes")
    saves, saving = kv_phases.begin(state.saves, [member], config.kv_caps, now, None)
    new = replace(
        state,
        residents={m: r for m, r in state.residents.items() if m != member},
        activity={m: a for m, a in state.activity.items() if m != member},
        idle_unloads={**state.idle_unloads, member: IdleUnload(member, now, idle_for)},
        saves=saves,
    )
    scale: list[Action] = [] if member in saves else [Scale(member, 0)]
    return new, [*saving, *scale, EmitEvent("Normal", IDLE_UNLOADED, message),
                 RecordIdleUnload(member)]


def _with_activity(state: ResidencyState, activity: Activity) -> ResidencyState:
    return replace(state, activity={**state.activity, activity.member: activity})


def _used(state: ResidencyState, resident: Resident, now: float) -> ResidencyState:
    return replace(state, residents={**state.residents,
                                     resident.member: replace(resident, last_used=now)})


__all__ = [
    "EVICTED",
    "FAILED_CREATE",
    "IDLE_CHECK_FAILED",
    "IDLE_PROBE_UNSUPPORTED",
    "IDLE_UNLOADED",
    "IDLE_UNLOAD_UNSUPPORTED",
    "INVALID_BUDGET",
    "MIN_RESIDENCY",
    "NOT_A_MEMBER",
    "OVER_BUDGET",
    "PODS_BUSY",
    "SWAP_BUDGET_EXCEEDED",
    "UNSCHEDULABLE",
    "WAITING_FOR_ROOM",
    "Action",
    "Activity",
    "ActivityResult",
    "ClearRequest",
    "Deferral",
    "EmitEvent",
    "Event",
    "IdleResult",
    "IdleUnload",
    "LastLoad",
    "Load",
    "MemberPods",
    "MembersObserved",
    "Outcome",
    "Phase",
    "ProbeActivity",
    "ProbeIdle",
    "Problem",
    "RecordDeferral",
    "RecordEviction",
    "RecordFailure",
    "RecordIdleUnload",
    "RecordKvAbandoned",
    "RecordLoad",
    "Request",
    "RequestObserved",
    "ResidencyConfig",
    "ResidencyState",
    "Resident",
    "ResidentView",
    "RestoreResult",
    "RestoreSlots",
    "SaveResult",
    "SaveSlots",
    "Scale",
    "SpecObserved",
    "Tick",
    "Verdict",
    "desired_replicas",
    "evicting",
    "initial_state",
    "lru",
    "next_wakeup",
    "phase_of",
    "released",
    "residents_of",
    "room_left",
    "step",
    "used",
    "visible_loads",
]
