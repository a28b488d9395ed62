"""Tables of cases for the activator's pure state machine (sidecar.activator).

Each case starts from a pool state, feeds timed events through `step`, and states every
action the machine asked for, in order, and which requests are still held at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from sidecar.activator import (
    SHUTTING_DOWN,
    SWAP_ABANDONED,
    SWAP_BUDGET_EXCEEDED,
    TOO_MANY_HELD_REQUESTS,
    Action,
    Admit,
    Arrive,
    EndpointsObserved,
    Event,
    Fail,
    LastSwap,
    Leave,
    PoolLimits,
    PoolObserved,
    PoolRequest,
    PoolState,
    PoolStatus,
    Reconfigure,
    Reread,
    Shutdown,
    SwapProgress,
    Tick,
    WriteConflicted,
    WriteFailed,
    WriteRequest,
    WriteSucceeded,
    initial_state,
    step,
    waiters,
)

pytestmark = pytest.mark.unit

ME = "demo/chat/chat-a"
OTHER = "demo/chat/chat-b"
BUDGET = 60.0
LIMITS = PoolLimits(members=("coder", "gemma", "phi"), swap_budget=BUDGET, max_held=100)


def status(
    rv: int,
    resident: str | None = "coder",
    request: PoolRequest | None = None,
    swap: SwapProgress | None = None,
    last: LastSwap | None = None,
    present: bool = True,
) -> PoolStatus:
    return PoolStatus("heavy", str(rv), present, resident, request, swap, last)


def req(member: str | None, gen: int, by: str = ME) -> PoolRequest:
    return PoolRequest(member, gen, by)


def pool(
    st: PoolStatus | None = None,
    ready: frozenset[str] = frozenset({"coder"}),
    limits: PoolLimits = LIMITS,
) -> PoolState:
    base = initial_state("heavy", ME, limits)
    return replace(
        base, status=st if st is not None else status(10, request=req("coder", 3)), ready=ready
    )


def cas(member: str | None, gen: int, expected: PoolRequest | None, rv: int) -> WriteRequest:
    return WriteRequest(req(member, gen), expected, str(rv), True)


def fail(wid: int, member: str, code: str, held: float | None, retry: float) -> Fail:
    return Fail(wid, member, code, "*", retry, held)


@dataclass(frozen=True)
class Case:
    name: str
    given: PoolState
    events: list[tuple[float, Event]]
    actions: list[Action]
    held: list[int] = field(default_factory=list)


def run(state: PoolState, events: list[tuple[float, Event]]) -> tuple[PoolState, list[Action]]:
    out: list[Action] = []
    for now, event in events:
        state, actions = step(state, event, now)
        out += actions
    return state, out


def scrub(actions: list[Action]) -> list[Action]:
    """Messages are for people; the tables compare everything else."""
    return [replace(a, message="*") if isinstance(a, Fail) else a for a in actions]


GEMMA_ASKED = status(11, request=req("gemma", 4))  # our own request for gemma, as written
GEMMA_BY_OTHER = status(11, request=req("gemma", 4, OTHER))
DRAINING = status(12, request=req("gemma", 4), swap=SwapProgress("coder", "gemma", 4, "Draining"))
UNLOADING = status(12, request=req("gemma", 4), swap=SwapProgress("coder", "gemma", 4, "Unloading"))
LOADING = status(13, request=req("gemma", 4), swap=SwapProgress("coder", "gemma", 4, "Loading"))
GEMMA_RESIDENT = status(
    14,
    resident="gemma",
    request=req("gemma", 4),
    last=LastSwap("coder", "gemma", 4, "Succeeded", 20.0),
)
ABANDONED = status(
    14,
    request=req(None, 5, "reconciler"),
    last=LastSwap("coder", "gemma", 4, "Abandoned", 60.0, "SwapBudgetExceeded", "not Ready"),
)

FAILED_4 = LastSwap("coder", "gemma", 4, "Failed")

CASES = [
    # --- cold start ---
    Case(
        "cold pool: the first request asks for its member",
        pool(status(10, resident=None), ready=frozenset()),
        [(0, Arrive(1, "coder"))],
        [cas("coder", 1, None, 10)],
        held=[1],
    ),
    Case(
        "cold pool with no status at all: the write adds /status",
        pool(status(10, resident=None, present=False), ready=frozenset()),
        [(0, Arrive(1, "coder"))],
        [WriteRequest(req("coder", 1), None, "10", False)],
        held=[1],
    ),
    Case(
        "cold pool becomes resident only once its endpoint is ready",
        pool(status(10, resident=None), ready=frozenset()),
        [
            (0, Arrive(1, "coder")),
            (1, WriteSucceeded(status(11, resident=None, request=req("coder", 1)))),
            (5, PoolObserved(status(12, resident="coder", request=req("coder", 1)))),
            (6, EndpointsObserved(frozenset({"coder"}))),
        ],
        [cas("coder", 1, None, 10), Admit(1, "coder", 6.0)],
    ),
    Case(
        "unknown pool status: hold, write nothing",
        replace(pool(), status=None),
        [(0, Arrive(1, "coder"))],
        [],
        held=[1],
    ),
    # --- coalescing ---
    Case(
        "same-model requests coalesce onto the resident",
        pool(),
        [(0, Arrive(1, "coder")), (0, Arrive(2, "coder"))],
        [Admit(1, "coder", None), Admit(2, "coder", None)],
    ),
    Case(
        "the resident without a ready endpoint holds, and asks for nothing",
        pool(ready=frozenset()),
        [(0, Arrive(1, "coder")), (2, EndpointsObserved(frozenset({"coder"})))],
        [Admit(1, "coder", 2.0)],
    ),
    # --- cross-model hold ---
    Case(
        "a cross-model request is held and the swap requested once",
        pool(),
        [(0, Arrive(1, "gemma")), (1, Arrive(2, "gemma")), (2, Arrive(3, "coder"))],
        [cas("gemma", 4, req("coder", 3), 10), Admit(3, "coder", None)],
        held=[1, 2],
    ),
    Case(
        "after our write lands, more demand for the member writes nothing",
        pool(),
        [(0, Arrive(1, "gemma")), (1, WriteSucceeded(GEMMA_ASKED)), (2, Arrive(2, "gemma"))],
        [cas("gemma", 4, req("coder", 3), 10)],
        held=[1, 2],
    ),
    Case(
        "another router already asked for the member: just wait",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "gemma"))],
        [],
        held=[1],
    ),
    Case(
        "another member is already wanted: queue behind it, ask once it is resident",
        pool(GEMMA_BY_OTHER),
        [
            (0, Arrive(1, "phi")),
            (20, PoolObserved(replace(GEMMA_RESIDENT, request=req("gemma", 4, OTHER)))),
        ],
        [cas("phi", 5, req("gemma", 4, OTHER), 14)],
        held=[1],
    ),
    Case(
        "the swap completes: held requests are dispatched",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (3, PoolObserved(LOADING)),
            (20, PoolObserved(GEMMA_RESIDENT)),
            (21, EndpointsObserved(frozenset({"gemma"}))),
        ],
        [Admit(1, "gemma", 21.0)],
    ),
    Case(
        "the incumbent being unloaded takes no new requests",
        pool(UNLOADING),
        [(0, Arrive(1, "coder"))],
        [],
        held=[1],
    ),
    Case(
        "the incumbent still draining keeps serving (sticky)",
        pool(replace(DRAINING, request=req("gemma", 4, OTHER))),
        [(0, Arrive(1, "coder"))],
        [Admit(1, "coder", None)],
    ),
    # --- lost races ---
    Case(
        "a lost race re-reads before deciding, and waits if the member is wanted already",
        pool(),
        [
            (0, Arrive(1, "gemma")),
            (1, WriteConflicted()),
            (1, Arrive(2, "phi")),
            (2, PoolObserved(GEMMA_BY_OTHER)),
        ],
        [cas("gemma", 4, req("coder", 3), 10), Reread()],
        held=[1, 2],
    ),
    Case(
        "a lost race against a finished swap re-decides from the new generation",
        pool(),
        [
            (0, Arrive(1, "phi")),
            (1, WriteConflicted()),
            (2, PoolObserved(replace(GEMMA_RESIDENT, request=req("gemma", 4, OTHER)))),
        ],
        [cas("phi", 4, req("coder", 3), 10), Reread(), cas("phi", 5, req("gemma", 4, OTHER), 14)],
        held=[1],
    ),
    Case(
        "a read older than what we know is ignored",
        pool(),
        [
            (0, Arrive(1, "gemma")),
            (1, WriteSucceeded(GEMMA_ASKED)),
            (2, PoolObserved(status(10, request=req("coder", 3)))),
        ],
        [cas("gemma", 4, req("coder", 3), 10)],
        held=[1],
    ),
    Case(
        "an API error backs off, then writes again",
        pool(),
        [(0, Arrive(1, "gemma")), (1, WriteFailed()), (1.2, Tick()), (1.5, Tick())],
        [cas("gemma", 4, req("coder", 3), 10), cas("gemma", 4, req("coder", 3), 10)],
        held=[1],
    ),
    Case(
        "after the backoff any event may write again",
        pool(),
        [
            (0, Arrive(1, "gemma")),
            (1, WriteFailed()),
            (1.2, Arrive(2, "gemma")),
            (2, Arrive(3, "gemma")),
        ],
        [cas("gemma", 4, req("coder", 3), 10), cas("gemma", 4, req("coder", 3), 10)],
        held=[1, 2, 3],
    ),
    # --- hold budget and cap ---
    Case(
        "past swapBudget a held request fails, and our unserved request is withdrawn",
        pool(),
        [(0, Arrive(1, "gemma")), (1, WriteSucceeded(GEMMA_ASKED)), (60, Tick())],
        [
            cas("gemma", 4, req("coder", 3), 10),
            fail(1, "gemma", SWAP_BUDGET_EXCEEDED, 60.0, 1.0),
            cas(None, 5, req("gemma", 4), 11),
        ],
    ),
    Case(
        "just inside swapBudget the request is still held",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (59.9, Tick())],
        [],
        held=[1],
    ),
    Case(
        "over maxHeldRequests a request fails at once",
        pool(GEMMA_ASKED, limits=replace(LIMITS, max_held=2)),
        [(0, Arrive(1, "gemma")), (0, Arrive(2, "gemma")), (5, Arrive(3, "gemma"))],
        [fail(3, "gemma", TOO_MANY_HELD_REQUESTS, None, 10.0)],
        held=[1, 2],
    ),
    Case(
        "the cap counts requests held for the router's other pools",
        pool(GEMMA_BY_OTHER, limits=replace(LIMITS, max_held=2)),
        [(0, Arrive(1, "gemma", held_elsewhere=2))],
        [fail(1, "gemma", TOO_MANY_HELD_REQUESTS, None, 15.0)],
    ),
    Case(
        "the cap never refuses a request the resident serves at once",
        pool(GEMMA_ASKED, limits=replace(LIMITS, max_held=1)),
        [(0, Arrive(1, "gemma")), (0, Arrive(2, "coder"))],
        [Admit(2, "coder", None)],
        held=[1],
    ),
    # --- withdrawal ---
    Case(
        "every waiter gone before the swap began: withdraw",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (0, Arrive(2, "gemma")),
            (1, Leave(1, "gemma")),
            (2, Leave(2, "gemma")),
        ],
        [cas(None, 5, req("gemma", 4), 11)],
    ),
    Case(
        "every waiter gone while the incumbent drains: withdraw",
        pool(DRAINING),
        [(0, Arrive(1, "gemma")), (2, Leave(1, "gemma"))],
        [cas(None, 5, req("gemma", 4), 12)],
    ),
    Case(
        "a client leaving once the incumbent unloads never aborts the load",
        pool(UNLOADING),
        [(0, Arrive(1, "gemma")), (2, Leave(1, "gemma")), (3, PoolObserved(LOADING))],
        [],
    ),
    Case(
        "another router's request is never withdrawn by us",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "gemma")), (2, Leave(1, "gemma"))],
        [],
    ),
    Case(
        "a request withdrawn by another router is asked for again while we wait",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "gemma")), (2, PoolObserved(status(12, request=req(None, 5, OTHER))))],
        [cas("gemma", 6, req(None, 5, OTHER), 12)],
        held=[1],
    ),
    Case(
        "waiters for a member left, others wait for another: withdraw, then ask for theirs",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (1, Arrive(2, "phi")),
            (2, Leave(1, "gemma")),
            (3, WriteSucceeded(status(12, request=req(None, 5)))),
        ],
        [cas(None, 5, req("gemma", 4), 11), cas("phi", 6, req(None, 5), 12)],
        held=[2],
    ),
    # --- seeds/003: a stale withdrawal never undoes a newer request ---
    Case(
        "seeds/003: a request arriving while our withdrawal is in flight survives it",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (1, Leave(1, "gemma")),  # withdrawal written: gemma@4 -> null@5
            (1.1, Arrive(2, "gemma")),  # new demand while the withdrawal is in flight
            (1.2, WriteSucceeded(status(12, request=req(None, 5)))),
        ],
        [cas(None, 5, req("gemma", 4), 11), cas("gemma", 6, req(None, 5), 12)],
        held=[2],
    ),
    Case(
        "seeds/003: another router's newer request makes our withdrawal lose its CAS",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (1, Leave(1, "gemma")),
            (1.5, Arrive(2, "gemma")),
            (1.75, WriteConflicted()),  # someone wrote gemma@5 first: `test` saw 5, not 4
            (2, PoolObserved(status(12, request=req("gemma", 5, OTHER)))),
            (20, PoolObserved(replace(GEMMA_RESIDENT, request=req("gemma", 5, OTHER)))),
            (20, EndpointsObserved(frozenset({"gemma"}))),
        ],
        [cas(None, 5, req("gemma", 4), 11), Reread(), Admit(2, "gemma", 18.5)],
    ),
    # --- abandonment ---
    Case(
        "an abandoned swap fails its waiters at once, and only them",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (0, Arrive(2, "phi")),
            (0, Arrive(3, "coder")),
            (30, PoolObserved(ABANDONED)),
        ],
        [
            Admit(3, "coder", None),
            fail(1, "gemma", SWAP_ABANDONED, 30.0, 15.0),
            cas("phi", 6, req(None, 5, "reconciler"), 14),
        ],
        held=[2],
    ),
    Case(
        "the request cleared before lastSwap lands: ask again, then fail and withdraw",
        pool(LOADING),
        [
            (0, Arrive(1, "gemma")),
            (30, PoolObserved(replace(ABANDONED, last_swap=None))),
            (30.5, WriteSucceeded(status(15, request=req("gemma", 6)))),
            (31, PoolObserved(replace(ABANDONED, resource_version="16", request=req("gemma", 6)))),
        ],
        [
            cas("gemma", 6, req(None, 5, "reconciler"), 14),
            fail(1, "gemma", SWAP_ABANDONED, 31.0, 15.0),
            cas(None, 7, req("gemma", 6), 16),
        ],
    ),
    Case(
        "an abandonment from before we first looked fails nobody",
        replace(pool(), status=None),
        [(0, Arrive(1, "gemma")), (1, PoolObserved(ABANDONED))],
        [cas("gemma", 6, req(None, 5, "reconciler"), 14)],
        held=[1],
    ),
    Case(
        "a request whose swap already ended is settled: ask for its member again",
        replace(pool(), status=None),
        [
            (0, PoolObserved(status(11, request=req("gemma", 4, OTHER), last=FAILED_4))),
            (1, Arrive(1, "gemma")),
        ],
        [cas("gemma", 5, req("gemma", 4, OTHER), 11)],
        held=[1],
    ),
    # --- fair policy ---
    Case(
        "fair: once the oldest waiter waited maxWait, the incumbent takes no new requests",
        pool(GEMMA_BY_OTHER, limits=replace(LIMITS, max_wait=10.0)),
        [(0, Arrive(1, "gemma")), (5, Arrive(2, "coder")), (11, Arrive(3, "coder"))],
        [Admit(2, "coder", None)],
        held=[1, 3],
    ),
    Case(
        "fair: after the swap the incumbent's held requests ask for it in turn",
        pool(GEMMA_BY_OTHER, limits=replace(LIMITS, max_wait=10.0)),
        [
            (0, Arrive(1, "gemma")),
            (11, Arrive(2, "coder")),
            (20, PoolObserved(replace(GEMMA_RESIDENT, request=req("gemma", 4, OTHER)))),
            (20, EndpointsObserved(frozenset({"gemma"}))),
        ],
        [cas("coder", 5, req("gemma", 4, OTHER), 14), Admit(1, "gemma", 20.0)],
        held=[2],
    ),
    Case(
        "sticky: the incumbent keeps taking requests however long others wait",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "gemma")), (50, Arrive(2, "coder"))],
        [Admit(2, "coder", None)],
        held=[1],
    ),
    # --- config and shutdown ---
    Case(
        "a config reload keeps held requests and applies the new budget",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (5, Reconfigure(replace(LIMITS, swap_budget=5.0)))],
        [fail(1, "gemma", SWAP_BUDGET_EXCEEDED, 5.0, 1.0), cas(None, 5, req("gemma", 4), 11)],
    ),
    Case(
        "shutdown answers every held request, and every later one",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (1, Shutdown(7.0)), (2, Arrive(2, "coder"))],
        [
            fail(1, "gemma", SHUTTING_DOWN, 1.0, 7.0),
            fail(2, "coder", SHUTTING_DOWN, None, 15.0),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_activator_table(case: Case) -> None:
    state, actions = run(case.given, case.events)
    assert scrub(actions) == case.actions
    assert [w.id for w in waiters(state)] == case.held


def test_member_states_follow_the_shared_status() -> None:
    from sidecar.activator import member_state

    assert member_state(pool(), "coder") == "resident"
    assert member_state(pool(), "gemma") == "stopped"
    assert member_state(pool(GEMMA_ASKED), "gemma") == "loading"
    assert member_state(pool(LOADING), "gemma") == "loading"
    assert member_state(pool(UNLOADING), "coder") == "stopped"
    assert member_state(pool(ready=frozenset()), "coder") == "loading"
    assert member_state(replace(pool(), status=None), "coder") == "unavailable"
    assert member_state(pool(), "llama") == "unavailable"


def test_next_wakeup_names_the_earliest_deadline() -> None:
    from sidecar.activator import held_counts, next_wakeup

    fair = pool(GEMMA_BY_OTHER, limits=replace(LIMITS, max_wait=10.0))
    state, _ = run(fair, [(0, Arrive(1, "gemma")), (4, Arrive(2, "phi"))])
    assert next_wakeup(state, 5) == 10.0  # the fair turn of the oldest waiter
    assert next_wakeup(state, 12) == 14.0  # the next waiter's turn
    assert next_wakeup(state, 15) == 60.0  # then the oldest one's hold budget
    assert held_counts(state) == {"coder": 0, "gemma": 1, "phi": 1}
    assert next_wakeup(pool(), 0) is None
