"""The activator's decisions for one ModelPool, as a pure state machine.

Every decision a router makes about a pool lives here, apart from I/O so that tables of
cases can pin it down: which requests are served at once (coalesced onto the resident),
which are held, when the swap request is written into the pool's `status.request`, when
it is withdrawn, and when held requests are answered with an error. The async shell
(`sidecar.activation`) feeds events with the time and executes the actions; nothing in
this module awaits, reads a clock, touches the network or counts metrics.

Several router replicas share one pool, so the machine trusts only the shared status:
it writes a request by compare-and-swap against the generation it last read, and after a
lost race it re-reads before deciding again (docs/contracts.md section 2).

A swap's target can answer before the kubelet's next readiness probe marks its pod Ready.
While the pool's status names it the target of a swap in Loading, and someone here waits
for it, the shell probes its not-yet-ready address (`probe_wanted`); a 200 comes back as
`EarlyReady`, and the member counts as resident on that address until the normal path
(a ready endpoint) takes over or the status stops naming it.

A pool with a memory budget holds a set of residents, and its status says so: it lists
`residents` (an exclusive pool's status has none, and is read exactly as before) and the
`loads` under way, each with the residents it evicts (its victims). Every resident with a
ready endpoint is served at once; a victim stops being one once its load is past
Draining. Only a request for a member outside the set (and not being loaded) is held and
written into `status.request`, which is settled once its member is among the residents or
once its load is past Draining (such a load is never withdrawn, and several run at once,
so the next member that fits loads beside it). The early path applies to the target of
any load in Loading, and the fair policy's cutoff stops admission only to the victims of
a Draining load whose target waited maxWait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sidecar.retry_after import retry_after_seconds

# Error codes the shell turns into ActivationError (and the proxy into 503 + Retry-After).
SWAP_BUDGET_EXCEEDED = "swap_budget_exceeded"
TOO_MANY_HELD_REQUESTS = "too_many_held_requests"
SWAP_ABANDONED = "swap_abandoned"
SHUTTING_DOWN = "shutting_down"

# A swap in these phases has begun unloading its incumbent: withdrawing no longer helps,
# and the incumbent must not receive new requests.
_PAST_DRAINING = frozenset({"Saving", "Unloading", "Loading", "Restoring"})
_FAILED_OUTCOMES = frozenset({"Abandoned", "Failed"})
_RECENT_SWAPS = 10
_WRITE_BACKOFF_MAX = 10.0


# --- The shared pool status, as the router reads it -------------------------------------


@dataclass(frozen=True)
class PoolRequest:
    member: str | None
    generation: int
    requested_by: str | None = None


@dataclass(frozen=True)
class SwapProgress:
    from_member: str | None
    to_member: str
    generation: int | None
    phase: str
    # What the swap is stuck on, as the pool's Ready condition says (the target cannot be
    # scheduled or created, or its container does not run); None while it just proceeds.
    stuck_on: str | None = None
    # A budgeted pool's load: the residents evicted (while Draining: to be evicted) for it.
    victims: tuple[str, ...] = ()
    # The target's saved slots are restored once it is Ready: no early answer counts.
    restores: bool = False


@dataclass(frozen=True)
class LastSwap:
    from_member: str | None
    to_member: str | None
    generation: int | None
    outcome: str
    duration_seconds: float | None = None
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class PoolStatus:
    """What a router needs of a ModelPool: its status and the version it was read at."""

    name: str
    resource_version: str
    status_present: bool = True
    resident_member: str | None = None
    request: PoolRequest | None = None
    swap: SwapProgress | None = None
    last_swap: LastSwap | None = None
    # A pool with a memory budget: its residents (maybe none) and its loads under way,
    # oldest first. None and () for an exclusive pool, whose status has no such fields.
    residents: frozenset[str] | None = None
    loads: tuple[SwapProgress, ...] = ()
    # And what of its budget is free, and each member's footprint (bytes): whether a
    # member fits without evicting anyone.
    room_left: int | None = None
    footprints: Mapping[str, int] = field(default_factory=dict)


# --- State --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolLimits:
    """The pool's settings from the router config, and the router-wide hold cap."""

    members: tuple[str, ...]
    swap_budget: float
    max_held: int
    max_wait: float | None = None  # set only for the fair policy


@dataclass(frozen=True)
class Waiter:
    id: int
    member: str
    since: float


@dataclass(frozen=True)
class PoolState:
    name: str
    identity: str  # requestedBy of our own writes: ns/router/pod
    limits: PoolLimits
    status: PoolStatus | None = None  # None until the first list or read
    ready: frozenset[str] = frozenset()  # members with a ready endpoint
    # Held requests per member, oldest first. Never mutated in place: every change builds
    # a new dict, so a state stays a value. Per-member FIFOs keep a step O(members) for
    # the common events even with thousands of requests held.
    queues: Mapping[str, tuple[Waiter, ...]] = field(default_factory=dict)
    writing: PoolRequest | None = None  # the request being written, at its new generation
    needs_read: bool = False  # a write lost its race: decide again only after a re-read
    write_retry_at: float | None = None
    write_failures: int = 0
    recent_swaps: tuple[float, ...] = ()  # durations of recent successful swaps
    answered: int = 0  # the newest request generation whose swap ended, any outcome
    closed: bool = False
    # (member, address) that answered its readiness probe before its endpoint turned ready.
    early: tuple[str, str] | None = None


def initial_state(name: str, identity: str, limits: PoolLimits) -> PoolState:
    return PoolState(name=name, identity=identity, limits=limits)


# --- Events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrive:
    """A request for `member`; `held_elsewhere` counts this router's other held requests."""

    waiter: int
    member: str
    held_elsewhere: int = 0


@dataclass(frozen=True)
class Leave:
    """The client went away (cancellation). Never aborts a load; may withdraw a request."""

    waiter: int
    member: str


@dataclass(frozen=True)
class Tick:
    """Time passed: deadlines are checked on every event, this one carries nothing else."""


@dataclass(frozen=True)
class PoolObserved:
    status: PoolStatus | None  # None: the pool is gone (or not yet created)


@dataclass(frozen=True)
class EndpointsObserved:
    ready: frozenset[str]


@dataclass(frozen=True)
class EarlyReady:
    """The not-yet-ready `address` ("host:port") of `member` answered its readiness probe."""

    member: str
    address: str


@dataclass(frozen=True)
class EarlyLost:
    """`address` of `member` left its EndpointSlice, or a connection to it failed."""

    member: str
    address: str


@dataclass(frozen=True)
class WriteSucceeded:
    status: PoolStatus  # the pool as the patch left it


@dataclass(frozen=True)
class WriteConflicted:
    """The `test` op failed: someone wrote first."""


@dataclass(frozen=True)
class WriteFailed:
    """The API server could not be reached or refused for another reason."""


@dataclass(frozen=True)
class Reconfigure:
    limits: PoolLimits


@dataclass(frozen=True)
class Shutdown:
    retry_after: float


Event = (
    Arrive
    | Leave
    | Tick
    | PoolObserved
    | EndpointsObserved
    | EarlyReady
    | EarlyLost
    | WriteSucceeded
    | WriteConflicted
    | WriteFailed
    | Reconfigure
    | Shutdown
)


# --- Actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    """Dispatch the request now. `held_for` is None when it was served at once (coalesced)."""

    waiter: int
    member: str
    held_for: float | None


@dataclass(frozen=True)
class Fail:
    waiter: int
    member: str
    code: str
    message: str
    retry_after: float
    held_for: float | None
    # What the client is answered: 503 with Retry-After for every refusal (an OpenAI SDK
    # retries it after the swap), never 429, which says the client itself sent too much.
    status: int = 503


@dataclass(frozen=True)
class WriteRequest:
    """CAS-write `status.request`: `request` is the new value, `expected` what we read."""

    request: PoolRequest
    expected: PoolRequest | None
    resource_version: str
    status_present: bool


@dataclass(frozen=True)
class Reread:
    """Read the pool again and feed the result back as PoolObserved."""


Action = Admit | Fail | WriteRequest | Reread


# --- Queries the shell uses ---------------------------------------------------------------


def is_resident(state: PoolState, member: str) -> bool:
    """Resident = the shared status names it AND a ready endpoint exists AND it is not being
    unloaded; or the status names it the target of a swap in Loading (or resident, with no
    swap) AND its address answered the readiness probe early (`early_address`). In a
    budgeted pool the status names it among its residents, and it is not the victim of a
    load past Draining."""
    status = state.status
    if status is None:
        return False
    if state.early is not None and state.early[0] == member and _early_allowed(status, member):
        return True
    if status.residents is not None:
        return (
            member in status.residents
            and member in state.ready
            and member not in _evicted(status)
        )
    if status.resident_member != member or member not in state.ready:
        return False
    swap = status.swap
    return not (swap is not None and swap.from_member == member and swap.phase in _PAST_DRAINING)


def early_address(state: PoolState, member: str) -> str | None:
    """The address `member` is dispatchable on before its endpoint turned ready, or None."""
    early, status = state.early, state.status
    if early is None or early[0] != member or status is None:
        return None
    return early[1] if _early_allowed(status, member) else None


def probe_wanted(state: PoolState) -> str | None:
    """The member whose not-ready address the shell should probe now, or None: the target
    of a swap in Loading, with requests held here, no ready endpoint and no early answer.
    In a budgeted pool: the first such target among its loads in Loading, while no member
    holds an early answer (one at a time)."""
    status = state.status
    if status is not None and status.residents is not None:
        if state.early is not None:
            return None
        return next(
            (
                x.to_member
                for x in status.loads
                if x.phase == "Loading"
                and not x.restores
                and x.to_member in state.limits.members
                and x.to_member not in state.ready
                and state.queues.get(x.to_member)
            ),
            None,
        )
    if (status is None or status.swap is None or status.swap.phase != "Loading"
            or status.swap.restores):
        return None
    member = status.swap.to_member
    if (
        member not in state.limits.members
        or member in state.ready
        or not state.queues.get(member)
        or (state.early is not None and state.early[0] == member)
    ):
        return None
    return member


def member_state(state: PoolState, member: str) -> str:
    """resident, loading or stopped; unavailable when the pool's status is unknown."""
    status = state.status
    if status is None or member not in state.limits.members:
        return "unavailable"
    if is_resident(state, member):
        return "resident"
    if status.residents is not None:
        if (
            (member in status.residents and member not in _evicted(status))
            or any(x.to_member == member for x in status.loads)
            or (status.request is not None and status.request.member == member)
        ):
            return "loading"
        return "stopped"
    if status.resident_member == member and status.swap is None:
        return "loading"  # named resident, endpoint not ready yet
    if status.swap is not None and status.swap.to_member == member:
        return "loading"
    if status.request is not None and status.request.member == member:
        return "loading"
    return "stopped"


def held_counts(state: PoolState) -> dict[str, int]:
    counts = dict.fromkeys(state.limits.members, 0)
    counts.update({m: len(q) for m, q in state.queues.items()})
    return counts


def held_total(state: PoolState) -> int:
    return sum(len(q) for q in state.queues.values())


def waiters(state: PoolState) -> list[Waiter]:
    """Every held request, oldest first."""
    return sorted((w for q in state.queues.values() for w in q), key=lambda w: (w.since, w.id))


def next_wakeup(state: PoolState, now: float) -> float | None:
    """The next time a Tick can change something (a hold deadline, the fair policy's turn,
    a write retry), or None."""
    heads = [q[0] for q in state.queues.values() if q]
    times: list[float] = [w.since + state.limits.swap_budget for w in heads]
    if state.limits.max_wait is not None:
        # The fair turn of each member's oldest waiter still to come.
        times += [t for w in _fair_turns(state) if (t := w.since + state.limits.max_wait) > now]
    if state.write_retry_at is not None:
        times.append(state.write_retry_at)
    return min(times, default=None)


# --- The step -----------------------------------------------------------------------------


def step(state: PoolState, event: Event, now: float) -> tuple[PoolState, list[Action]]:
    actions: list[Action] = []
    if state.write_retry_at is not None and now >= state.write_retry_at:
        state = replace(state, write_retry_at=None)  # the write backoff is over
    state = _apply(state, event, now, actions)
    state = _expire(state, now, actions)
    state = _admit(state, now, actions)
    state = _decide(state, actions)
    return state, actions


def _apply(state: PoolState, event: Event, now: float, actions: list[Action]) -> PoolState:
    match event:
        case Arrive(waiter=wid, member=member, held_elsewhere=elsewhere):
            return _arrive(state, wid, member, elsewhere, now, actions)
        case Leave(waiter=wid, member=member):
            queue = state.queues.get(member, ())
            return _with_queue(state, member, tuple(w for w in queue if w.id != wid))
        case Tick():
            return state
        case PoolObserved(status=status):
            return _observe(state, status, now, actions)
        case EndpointsObserved(ready=ready):
            if state.early is not None and state.early[0] in ready:
                state = replace(state, early=None)  # the normal path takes over
            return replace(state, ready=ready)
        case EarlyReady(member=member, address=address):
            status = state.status
            if status is None or member in state.ready or not _early_allowed(status, member):
                return state  # the status moved on while the probe ran
            return replace(state, early=(member, address))
        case EarlyLost(member=member, address=address):
            if state.early == (member, address):
                return replace(state, early=None)
            return state
        case WriteSucceeded(status=status):
            state = replace(state, writing=None, write_failures=0, write_retry_at=None)
            return _observe(state, status, now, actions)
        case WriteConflicted():
            actions.append(Reread())
            return replace(state, writing=None, needs_read=True)
        case WriteFailed():
            failures = state.write_failures + 1
            backoff = min(_WRITE_BACKOFF_MAX, 0.5 * 2 ** (failures - 1))
            return replace(
                state, writing=None, write_failures=failures, write_retry_at=now + backoff
            )
        case Reconfigure(limits=limits):
            return replace(state, limits=limits)
        case Shutdown(retry_after=retry_after):
            for w in waiters(state):
                actions.append(
                    Fail(
                        w.id,
                        w.member,
                        SHUTTING_DOWN,
                        "the router is shutting down",
                        retry_after,
                        now - w.since,
                    )
                )
            return replace(state, queues={}, closed=True)
    raise AssertionError(f"unknown event {event!r}")  # pragma: no cover


def _arrive(
    state: PoolState, wid: int, member: str, elsewhere: int, now: float, actions: list[Action]
) -> PoolState:
    if state.closed:
        actions.append(
            Fail(
                wid,
                member,
                SHUTTING_DOWN,
                "the router is shutting down",
                _retry_after(state, None),
                None,
            )
        )
        return state
    waiter = Waiter(wid, member, now)
    if _admissible(state, waiter):
        actions.append(Admit(wid, member, None))
        return state
    if held_total(state) + elsewhere >= state.limits.max_held:
        actions.append(
            Fail(
                wid,
                member,
                TOO_MANY_HELD_REQUESTS,
                f"{state.limits.max_held} requests are already held; try again later",
                _retry_after(state, _oldest_wait(state, now)),
                None,
            )
        )
        return state
    # Concatenation copies at memcpy speed; unpacking is several times slower at 10k held.
    return _with_queue(state, member, state.queues.get(member, ()) + (waiter,))  # noqa: RUF005


def _observe(
    state: PoolState, status: PoolStatus | None, now: float, actions: list[Action]
) -> PoolState:
    old = state.status
    if status is not None and old is not None and _older(status, old):
        return replace(state, needs_read=False)  # a stale read: keep what we know
    state = replace(state, status=status, needs_read=False)
    if state.early is not None and (status is None or not _early_allowed(status, state.early[0])):
        state = replace(state, early=None)
    last = status.last_swap if status is not None else None
    if last is not None and last.generation is not None and last.generation > state.answered:
        state = replace(state, answered=last.generation)
    if status is None or old is None:
        return state  # the first sight of a pool's history is not news
    if last is None or last == old.last_swap:
        return state
    if last.outcome == "Succeeded" and last.duration_seconds is not None:
        recent = (*state.recent_swaps, last.duration_seconds)[-_RECENT_SWAPS:]
        state = replace(state, recent_swaps=recent)
    if last.outcome in _FAILED_OUTCOMES and last.to_member is not None:
        doomed = state.queues.get(last.to_member, ())
        detail = last.message or last.reason or last.outcome
        for w in doomed:
            actions.append(
                Fail(
                    w.id,
                    w.member,
                    SWAP_ABANDONED,
                    f"the swap to {w.member} was abandoned: {detail}",
                    _retry_after(state, None),
                    now - w.since,
                )
            )
        state = _with_queue(state, last.to_member, ())
    return state


def _expire(state: PoolState, now: float, actions: list[Action]) -> PoolState:
    budget = state.limits.swap_budget
    for member, queue in state.queues.items():
        # Every waiter has the same budget, so the expired ones are the oldest: a prefix.
        n = 0
        while n < len(queue) and now - queue[n].since >= budget:
            n += 1
        if n:
            state = _with_queue(state, member, queue[n:])
        for w in queue[:n]:
            actions.append(
                Fail(
                    w.id,
                    w.member,
                    SWAP_BUDGET_EXCEEDED,
                    f"{w.member} did not become resident within swapBudget {budget:g}s",
                    _retry_after(state, now - w.since),
                    now - w.since,
                )
            )
    return state


def _admit(state: PoolState, now: float, actions: list[Action]) -> PoolState:
    for member, queue in state.queues.items():
        if not queue or not is_resident(state, member):
            continue
        cutoff = _fair_cutoff(state, member)
        # Oldest first, so the admissible ones (arrived before the fair cutoff) are a prefix.
        n = 0
        while n < len(queue) and (cutoff is None or queue[n].since < cutoff):
            n += 1
        if n:
            state = _with_queue(state, member, queue[n:])
        actions.extend(Admit(w.id, member, now - w.since) for w in queue[:n])
    return state


def _decide(state: PoolState, actions: list[Action]) -> PoolState:
    """Write at most one request change: ask for the member the oldest waiter wants, or
    withdraw our own request that nobody here waits for any more."""
    status = state.status
    if (
        status is None
        or state.closed
        or state.writing is not None
        or state.needs_read
        or state.write_retry_at is not None
    ):
        return state
    current = status.request
    wanted = next((w.member for w in _non_incumbent(state)), None)
    # A request is settled once nothing more will come of it: withdrawn, served (its member
    # is resident), or answered by a swap that ended. Only then may a new one replace it;
    # an unsettled request for another member is the queue we wait in. A budgeted pool
    # never withdraws a load past Draining and runs several at once: its request is
    # settled as soon as its load is past Draining, so the next member that fits loads
    # beside it.
    settled = (
        current is None
        or current.member is None
        or (
            current.member == status.resident_member
            if status.residents is None
            else current.member in status.residents or _unloading_for(status, current)
        )
        or current.generation <= state.answered
    )
    new_member: str | None
    if wanted is not None and settled:
        new_member = wanted
    elif (
        not settled
        and current is not None
        and current.member is not None
        and current.requested_by == state.identity
        and not state.queues.get(current.member)
        and not _unloading_for(status, current)
    ):
        new_member = None  # withdraw: our waiters all left before the incumbent unloaded
    else:
        return state
    request = PoolRequest(
        new_member, (current.generation if current is not None else 0) + 1, state.identity
    )
    actions.append(WriteRequest(request, current, status.resource_version, status.status_present))
    return replace(state, writing=request)


# --- Helpers ------------------------------------------------------------------------------


def _admissible(state: PoolState, waiter: Waiter) -> bool:
    if not is_resident(state, waiter.member):
        return False
    cutoff = _fair_cutoff(state, waiter.member)
    return cutoff is None or waiter.since < cutoff


def _early_allowed(status: PoolStatus, member: str) -> bool:
    """Whether the status lets an early answer count: `member` is the target of a swap in
    Loading (its incumbent's pods are gone), or resident with no swap running. In a
    budgeted pool: the target of any load in Loading, or a resident not being unloaded."""
    if status.residents is not None:
        if any(x.to_member == member and x.phase == "Loading" and not x.restores
               for x in status.loads):
            return True
        return member in status.residents and member not in _evicted(status)
    swap = status.swap
    if swap is not None:
        return swap.to_member == member and swap.phase == "Loading" and not swap.restores
    return status.resident_member == member


def _fair_cutoff(state: PoolState, member: str) -> float | None:
    """Fair policy: requests that arrive once the oldest waiter for another member has waited
    maxWait are not admitted to the incumbent, so it drains and the swap can happen. In a
    budgeted pool the cutoff applies only to the victims of a Draining load, once the
    oldest waiter for its target waited maxWait; the other residents serve on."""
    max_wait = state.limits.max_wait
    if max_wait is None:
        return None
    status = state.status
    if status is not None and status.residents is not None:
        return min(
            (
                queue[0].since + max_wait
                for x in status.loads  # past Draining, a victim serves no more anyway
                if member in x.victims and (queue := state.queues.get(x.to_member))
            ),
            default=None,
        )
    return min((w.since + max_wait for w in _fair_turns(state)), default=None)


def _fair_turns(state: PoolState) -> list[Waiter]:
    """The waiters whose maxWait starts a fair cutoff: the oldest of each member other
    than the resident one; in a budgeted pool, of each target of a load with victims."""
    status = state.status
    if status is None or status.residents is None:
        return _non_incumbent(state)
    heads = [q[0] for x in status.loads if x.victims and (q := state.queues.get(x.to_member))]
    return sorted(heads, key=lambda w: (w.since, w.id))


def _non_incumbent(state: PoolState) -> list[Waiter]:
    """The oldest waiter of each member other than the resident one (in a budgeted pool:
    other than the residents and the targets of its loads), oldest first."""
    status = state.status
    resident = status.resident_member if status is not None else None
    staying: frozenset[str] | None = None
    if status is not None and status.residents is not None:
        staying = status.residents | {x.to_member for x in status.loads}
    heads = [
        q[0]
        for m, q in state.queues.items()
        if q and (m != resident if staying is None else m not in staying)
    ]
    return sorted(heads, key=lambda w: (w.since, w.id))


def _with_queue(state: PoolState, member: str, queue: tuple[Waiter, ...]) -> PoolState:
    queues = {m: q for m, q in state.queues.items() if m != member}
    if queue:
        queues[member] = queue
    return replace(state, queues=queues)


def _loads(status: PoolStatus) -> tuple[SwapProgress, ...]:
    """The loads under way: a budgeted pool's `loads`, or an exclusive pool's swap."""
    if status.residents is not None:
        return status.loads
    return (status.swap,) if status.swap is not None else ()


def _evicted(status: PoolStatus) -> frozenset[str]:
    """A budgeted pool's victims of the loads past Draining: being unloaded."""
    return frozenset(m for x in status.loads if x.phase in _PAST_DRAINING for m in x.victims)


def _unloading_for(status: PoolStatus, request: PoolRequest) -> bool:
    return any(
        x.phase in _PAST_DRAINING
        and (x.generation is None or x.generation == request.generation)
        for x in _loads(status)
    )


def _older(new: PoolStatus, old: PoolStatus) -> bool:
    """Whether `new` was read before `old`. Resource versions are opaque to clients, but the
    API server hands out etcd revisions, which grow; a read and a watch event racing in the
    shell must not roll the state back. Request generations break ties either way."""
    if (
        new.request is not None
        and old.request is not None
        and new.request.generation != old.request.generation
    ):
        return new.request.generation < old.request.generation
    if new.resource_version.isdigit() and old.resource_version.isdigit():
        return int(new.resource_version) < int(old.resource_version)
    return False


def _oldest_wait(state: PoolState, now: float) -> float | None:
    return max((now - q[0].since for q in state.queues.values() if q), default=None)


def _retry_after(state: PoolState, elapsed: float | None) -> float:
    return retry_after_seconds(state.recent_swaps, budget=state.limits.swap_budget, elapsed=elapsed)
