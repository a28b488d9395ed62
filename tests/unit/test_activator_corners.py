"""The activator's rules at their corners, and what it tells a refused client.

The table in test_activator.py walks each rule along its main path and leaves messages
out; here are the cases where a rule could be off by one comparison (mutation testing,
scripts/mutation, found them unpinned): several requests at once, a request arriving at
the very instant of a deadline, reads that race, resource versions that are not numbers.
And the words, Retry-After and held time of each refusal, which a client sees in its 503.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.activator import (
    SHUTTING_DOWN,
    SWAP_ABANDONED,
    SWAP_BUDGET_EXCEEDED,
    TOO_MANY_HELD_REQUESTS,
    Admit,
    Arrive,
    EarlyReady,
    EndpointsObserved,
    Fail,
    LastSwap,
    Leave,
    PoolObserved,
    Reread,
    Shutdown,
    SwapProgress,
    Tick,
    WriteConflicted,
    WriteFailed,
    WriteRequest,
    WriteSucceeded,
    early_address,
    initial_state,
    next_wakeup,
    probe_wanted,
    step,
    waiters,
)
from tests.unit.test_activator import (
    ABANDONED,
    GEMMA_ASKED,
    GEMMA_BY_OTHER,
    GEMMA_RESIDENT,
    LIMITS,
    LOADING,
    ME,
    Case,
    cas,
    fail,
    pool,
    req,
    run,
    scrub,
    status,
)

pytestmark = pytest.mark.unit

FAIR = replace(LIMITS, max_wait=10.0)
ADDRESS = "127.0.1.7:8080"
GONE = frozenset[str]()

CASES = [
    # --- several requests at once ---
    Case(
        "one of two waiters leaves: the other is still held, nothing withdrawn",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (0, Arrive(2, "gemma")), (1, Leave(1, "gemma"))],
        [],
        held=[2],
    ),
    Case(
        "a client leaving after it was served changes nothing",
        pool(),
        [(0, Arrive(1, "coder")), (1, Leave(1, "coder"))],
        [Admit(1, "coder", None)],
    ),
    Case(
        "two requests held for the resident's endpoint are admitted together",
        pool(ready=GONE),
        [
            (0, Arrive(1, "coder")),
            (1, Arrive(2, "coder")),
            (2, EndpointsObserved(frozenset({"coder"}))),
        ],
        [Admit(1, "coder", 2.0), Admit(2, "coder", 1.0)],
    ),
    Case(
        "requests held for a member not resident do not hold up the resident's",
        pool(GEMMA_BY_OTHER, ready=GONE),
        [
            (0, Arrive(1, "gemma")),
            (1, Arrive(2, "coder")),
            (3, EndpointsObserved(frozenset({"coder"}))),
        ],
        [Admit(2, "coder", 2.0)],
        held=[1],
    ),
    Case(
        "two requests past swapBudget fail together",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "gemma")), (0, Arrive(2, "gemma")), (60, Tick())],
        [
            fail(1, "gemma", SWAP_BUDGET_EXCEEDED, 60.0, 1.0),
            fail(2, "gemma", SWAP_BUDGET_EXCEEDED, 60.0, 1.0),
        ],
    ),
    Case(
        "past swapBudget only the older request fails; the younger is still held",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "gemma")), (10, Arrive(2, "gemma")), (60, Tick())],
        [fail(1, "gemma", SWAP_BUDGET_EXCEEDED, 60.0, 1.0)],
        held=[2],
    ),
    # --- the fair policy at its deadline ---
    Case(
        "fair: a request arriving at the very instant of the oldest waiter's turn is held",
        pool(GEMMA_BY_OTHER, limits=FAIR),
        [(0, Arrive(1, "gemma")), (10, Arrive(2, "coder"))],
        [],
        held=[1, 2],
    ),
    Case(
        "fair: the resident turning ready admits only what came before the other's turn",
        pool(GEMMA_BY_OTHER, ready=GONE, limits=FAIR),
        [
            (0, Arrive(1, "gemma")),
            (4, Arrive(2, "coder")),
            (5, Arrive(3, "coder")),
            (10, Arrive(4, "coder")),
            (12, EndpointsObserved(frozenset({"coder"}))),
        ],
        [Admit(2, "coder", 8.0), Admit(3, "coder", 7.0)],
        held=[1, 4],
    ),
    Case(
        "fair: with nobody waiting for another member the resident serves at once",
        pool(limits=FAIR),
        [(0, Arrive(1, "coder"))],
        [Admit(1, "coder", None)],
    ),
    Case(
        "fair: with the pool's status unknown a request is held",
        replace(pool(limits=FAIR), status=None),
        [(0, Arrive(1, "coder"))],
        [],
        held=[1],
    ),
    # --- withdrawal ---
    Case(
        "waiters gone while a swap with no generation unloads: nothing withdrawn",
        pool(status(12, request=req("gemma", 4),
                    swap=SwapProgress("coder", "gemma", None, "Unloading"))),
        [(0, Arrive(1, "gemma")), (1, Leave(1, "gemma"))],
        [],
    ),
    # --- reads that race ---
    Case(
        "a lost race re-decides even when the re-read is older than what we know",
        pool(),
        [(0, Arrive(1, "gemma")), (1, WriteConflicted()),
         (2, PoolObserved(status(9, request=req("coder", 3))))],
        [cas("gemma", 4, req("coder", 3), 10), Reread(), cas("gemma", 4, req("coder", 3), 10)],
        held=[1],
    ),
    Case(
        "a read with no request, older by resource version, is ignored",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (1, PoolObserved(status(10)))],
        [],
        held=[1],
    ),
    Case(
        "a read of the same request, older by resource version, is ignored",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (1, PoolObserved(replace(GEMMA_RESIDENT, resource_version="10"))),
            (2, EndpointsObserved(frozenset({"gemma"}))),
        ],
        [],
        held=[1],
    ),
    Case(
        "resource versions that are not numbers are taken as they come",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (1, PoolObserved(replace(GEMMA_RESIDENT, resource_version="v9"))),
            (2, EndpointsObserved(frozenset({"gemma"}))),
        ],
        [Admit(1, "gemma", 2.0)],
    ),
    Case(
        "the pool deleted: held requests stay held and nothing is written",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (1, PoolObserved(None)), (2, Arrive(2, "phi"))],
        [],
        held=[1, 2],
    ),
    # --- abandonment ---
    Case(
        "an abandoned swap nobody here waits for fails nobody",
        pool(GEMMA_BY_OTHER),
        [(0, Arrive(1, "phi")), (30, PoolObserved(ABANDONED))],
        [cas("phi", 6, req(None, 5, "reconciler"), 14)],
        held=[1],
    ),
    Case(
        "the same abandonment read again fails no later request",
        pool(GEMMA_ASKED),
        [
            (0, Arrive(1, "gemma")),
            (30, PoolObserved(ABANDONED)),
            (31, Arrive(2, "gemma")),
            (32, WriteSucceeded(replace(ABANDONED, resource_version="15",
                                        request=req("gemma", 6)))),
        ],
        [fail(1, "gemma", SWAP_ABANDONED, 30.0, 15.0),
         cas("gemma", 6, req(None, 5, "reconciler"), 14)],
        held=[2],
    ),
    Case(
        "an abandonment first seen in our own write's answer fails its waiters",
        pool(),
        [
            (0, Arrive(1, "phi")),
            (1, Arrive(2, "gemma")),
            (2, WriteSucceeded(status(11, request=req("phi", 4), last=LastSwap(
                "coder", "gemma", 2, "Abandoned", 60.0, "SwapBudgetExceeded", "not Ready")))),
        ],
        [cas("phi", 4, req("coder", 3), 10), fail(2, "gemma", SWAP_ABANDONED, 1.0, 15.0)],
        held=[1],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_activator_corners_table(case: Case) -> None:
    state, actions = run(case.given, case.events)
    assert scrub(actions) == case.actions
    assert [w.id for w in waiters(state)] == case.held


def test_a_router_writes_requests_under_its_own_identity() -> None:
    state = initial_state("heavy", ME, LIMITS)
    assert (state.name, state.identity) == ("heavy", ME)
    state, actions = run(state, [(0, PoolObserved(status(10))), (1, Arrive(1, "gemma"))])
    assert actions == [WriteRequest(req("gemma", 1, ME), None, "10", True)]


# --- what a refused client is told ------------------------------------------------------


def test_shutting_down_says_so_to_held_and_later_requests() -> None:
    _, actions = run(pool(GEMMA_ASKED), [
        (2, Arrive(1, "gemma")), (5, Shutdown(7.0)), (6, Arrive(2, "coder"))])
    said = "the router is shutting down"
    assert actions == [
        Fail(1, "gemma", SHUTTING_DOWN, said, 7.0, 3.0),
        Fail(2, "coder", SHUTTING_DOWN, said, 15.0, None),
    ]


def test_a_full_router_says_how_many_it_holds_and_when_to_retry() -> None:
    _, actions = run(pool(GEMMA_ASKED, limits=replace(LIMITS, max_held=1)),
                     [(2, Arrive(1, "gemma")), (6, Arrive(2, "gemma"))])
    # 15 s is a quarter of the budget (no swap seen yet), less the 4 s the oldest waited
    assert actions == [Fail(2, "gemma", TOO_MANY_HELD_REQUESTS,
                            "1 requests are already held; try again later", 11.0, None)]


def test_a_request_past_its_budget_is_told_which_member_and_what_budget() -> None:
    # swaps here took 90 s, longer than this router holds a request: retry in the rest
    state = replace(pool(GEMMA_BY_OTHER), recent_swaps=(90.0,))
    _, actions = run(state, [(2, Arrive(1, "gemma")), (62, Tick())])
    assert actions == [Fail(1, "gemma", SWAP_BUDGET_EXCEEDED,
                            "gemma did not become resident within swapBudget 60s", 30.0, 60.0)]


@pytest.mark.parametrize(("message", "reason", "detail"), [
    ("not Ready within 60s", "SwapBudgetExceeded", "not Ready within 60s"),
    (None, "SwapBudgetExceeded", "SwapBudgetExceeded"),
    (None, None, "Abandoned"),
])
def test_an_abandoned_swap_tells_its_waiters_why(
    message: str | None, reason: str | None, detail: str
) -> None:
    last = LastSwap("coder", "gemma", 4, "Abandoned", 60.0, reason, message)
    _, actions = run(pool(GEMMA_ASKED), [
        (5, Arrive(1, "gemma")),
        (30, PoolObserved(status(14, request=req(None, 5, "reconciler"), last=last))),
    ])
    assert actions == [Fail(1, "gemma", SWAP_ABANDONED,
                            f"the swap to gemma was abandoned: {detail}", 15.0, 25.0)]


def test_retry_after_follows_the_swaps_seen_here() -> None:
    swapped = status(14, resident="gemma", request=req("gemma", 4),
                     last=LastSwap("coder", "gemma", 4, "Succeeded", 20.0))
    state, _ = run(pool(GEMMA_ASKED), [(0, PoolObserved(swapped))])
    assert state.recent_swaps == (20.0,)
    _, actions = run(state, [(1, Shutdown(7.0)), (2, Arrive(1, "coder"))])
    assert scrub(actions) == [fail(1, "coder", SHUTTING_DOWN, None, 20.0)]
    # a success without a duration tells nothing about how long swaps take
    unknown = replace(swapped, resource_version="15",
                      last_swap=LastSwap("gemma", "coder", 5, "Succeeded"))
    state, _ = run(state, [(3, PoolObserved(unknown))])
    assert state.recent_swaps == (20.0,)


def test_the_last_ten_swaps_make_retry_after() -> None:
    state = pool(GEMMA_ASKED)
    for gen in range(5, 17):
        done = status(gen * 10, request=req("gemma", gen),
                      last=LastSwap("coder", "gemma", gen, "Succeeded", float(gen)))
        state, _ = step(state, PoolObserved(done), float(gen))
    assert state.recent_swaps == tuple(float(g) for g in range(7, 17))


# --- write backoff ----------------------------------------------------------------------


def test_failed_writes_back_off_doubling_up_to_ten_seconds_and_a_success_resets_it() -> None:
    state, _ = step(pool(), Arrive(1, "gemma"), 0.0)
    now = 1.0
    for backoff in (0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0):
        state, _ = step(state, WriteFailed(), now)
        assert next_wakeup(state, now) == now + backoff
        now += backoff
        state, actions = step(state, Tick(), now)
        assert actions == [cas("gemma", 4, req("coder", 3), 10)]
    state, _ = step(state, WriteSucceeded(GEMMA_ASKED), now)
    state, actions = step(state, Leave(1, "gemma"), now + 1)
    assert actions == [cas(None, 5, req("gemma", 4), 11)]
    state, _ = step(state, WriteFailed(), now + 2)
    assert next_wakeup(state, now + 2) == now + 2.5


# --- early readiness --------------------------------------------------------------------


def test_an_early_answer_is_ignored_when_the_endpoint_is_ready_or_the_pool_unknown() -> None:
    ready, _ = run(pool(LOADING, ready=frozenset({"gemma"})),
                   [(0, EarlyReady("gemma", ADDRESS))])
    assert ready.early is None and early_address(ready, "gemma") is None
    unknown, _ = run(replace(pool(), status=None), [(0, EarlyReady("gemma", ADDRESS))])
    assert unknown.early is None


def test_an_early_address_is_forgotten_once_the_status_stops_naming_its_swap() -> None:
    state, _ = run(pool(LOADING, ready=GONE),
                   [(0, Arrive(1, "gemma")), (1, EarlyReady("gemma", ADDRESS))])
    assert early_address(state, "gemma") == ADDRESS
    # the swap was abandoned; a later swap to the same member starts from nothing
    again, _ = run(state, [(2, PoolObserved(ABANDONED)),
                           (3, PoolObserved(replace(LOADING, resource_version="16")))])
    assert early_address(again, "gemma") is None
    gone, _ = run(state, [(2, PoolObserved(None))])
    assert gone.early is None


def test_no_probe_is_wanted_for_a_member_that_answered_early_while_a_fair_turn_holds_some(
) -> None:
    state, _ = run(pool(LOADING, ready=GONE, limits=FAIR),
                   [(0, Arrive(1, "gemma")), (12, Arrive(2, "gemma"))])
    state, actions = step(state, EarlyReady("gemma", ADDRESS), 13)
    assert actions == [Admit(1, "gemma", 13.0)]  # 2 came after 1's fair turn, at 10
    assert [w.id for w in waiters(state)] == [2]
    assert probe_wanted(state) is None


def test_next_wakeup_at_the_instant_of_a_fair_turn_names_the_next_one() -> None:
    state, _ = run(pool(GEMMA_BY_OTHER, limits=FAIR),
                   [(0, Arrive(1, "gemma")), (4, Arrive(2, "phi"))])
    assert next_wakeup(state, 10) == 14.0

