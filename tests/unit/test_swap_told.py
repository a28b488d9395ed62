"""What the pool's swap tells people, word for word: its Events and its lastSwap.

Events are what `kubectl describe` shows and lastSwap is what `kubectl get -o yaml` shows;
an operator reads both to learn why a model is (not) resident, so each is pinned whole
here rather than by its reason alone (test_swap.py pins the rules that produce them).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler import swap as s
from reconciler.swap import (
    ActivityResult,
    ClearRequest,
    EmitEvent,
    IdleResult,
    LastSwap,
    MembersObserved,
    Outcome,
    PoolState,
    ProbeActivity,
    ProbeIdle,
    RecordDeferral,
    RecordFailure,
    RecordIdleUnload,
    RecordSwap,
    Request,
    RequestObserved,
    Scale,
    Tick,
    Verdict,
)
from tests.unit.test_swap import CONFIG, IDLE, RECLAIM, kinds, loading, pods, resident, run

pytestmark = pytest.mark.unit


def test_a_request_for_a_non_member_is_refused_in_a_warning_and_in_last_swap() -> None:
    state, actions = s.step(resident(), RequestObserved(Request("zzz", 4)), 10.0)
    message = "zzz is not a member of this pool"
    assert actions == [
        ClearRequest(4),
        EmitEvent("Warning", s.NOT_A_MEMBER, message),
        RecordFailure("zzz", s.NOT_A_MEMBER),
    ]
    assert state.last_swap == LastSwap(
        "a", "zzz", 4, 10.0, 0.0, Outcome.FAILED, s.NOT_A_MEMBER, message)


def test_a_swap_for_a_request_is_announced_with_its_generation() -> None:
    _, actions = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    assert actions == [
        EmitEvent("Normal", "SwapStarted", "swapping a -> b for request 1"),
        ProbeIdle("a"),
    ]


def test_a_completed_swap_says_from_what_and_how_long() -> None:
    state, actions = run(PoolState(config=CONFIG), [(0.0, MembersObserved(pods())),
                                                    (5.0, MembersObserved(pods(a=1)))])
    assert EmitEvent("Normal", "SwapCompleted", "a is resident (from (none), 5.0s)") in actions
    state, actions = run(state, [(10.0, RequestObserved(Request("b", 1))),
                                 (11.0, IdleResult("a", Verdict.IDLE)),
                                 (12.0, MembersObserved(pods())),
                                 (13.0, MembersObserved(loading(b=1))),
                                 (16.0, MembersObserved(pods(b=1)))])
    assert kinds(actions, RecordSwap) == [RecordSwap(
        "a", "b", 6.0, (("drain", 1.0), ("unload", 1.0), ("schedule", 1.0), ("load", 3.0)))]


@pytest.mark.parametrize(("verdict", "detail", "event"), [
    (Verdict.BUSY, "", "PodsBusy: a is serving requests"),
    (Verdict.BUSY, "2 in flight", "PodsBusy: a is serving requests: 2 in flight"),
    (Verdict.FAILED, "", "IdleCheckFailed: idle check of a failed"),
    (Verdict.FAILED, "timed out", "IdleCheckFailed: idle check of a failed: timed out"),
])
def test_a_deferral_is_announced_with_why(verdict: Verdict, detail: str, event: str) -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, actions = s.step(state, IdleResult("a", verdict, detail), 11.0)
    reason = event.split(":")[0]
    assert actions == [RecordDeferral(reason), EmitEvent("Normal", "SwapDeferred", event)]
    assert state.swap is not None and state.swap.deferral == s.Deferral(
        reason, event.removeprefix(f"{reason}: "))


def test_a_deferral_for_the_same_reason_updates_its_words_quietly_and_a_new_reason_is_told(
) -> None:
    state, _ = run(resident(), [(10.0, RequestObserved(Request("b", 1))),
                                (11.0, IdleResult("a", Verdict.BUSY, "2 in flight"))])
    state, _ = s.step(state, Tick(), 13.0)
    state, actions = s.step(state, IdleResult("a", Verdict.BUSY, "1 in flight"), 13.5)
    assert actions == []
    assert state.swap is not None and state.swap.deferral == s.Deferral(
        s.PODS_BUSY, "a is serving requests: 1 in flight")  # what the condition shows
    state, _ = s.step(state, Tick(), 15.5)
    state, actions = s.step(state, IdleResult("a", Verdict.FAILED), 16.0)
    assert actions == [
        RecordDeferral(s.IDLE_CHECK_FAILED),
        EmitEvent("Normal", "SwapDeferred", "IdleCheckFailed: idle check of a failed"),
    ]


def test_min_residency_is_announced_with_how_long() -> None:
    config = replace(CONFIG, min_residency=30.0)
    _, actions = s.step(resident(config=config), RequestObserved(Request("b", 1)), 10.0)
    assert actions[1:] == [
        RecordDeferral(s.MIN_RESIDENCY),
        EmitEvent("Normal", "SwapDeferred", "MinResidency: a has not been resident 30s yet"),
    ]


def test_a_withdrawn_swap_says_which_request_withdrew_it() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, actions = s.step(state, RequestObserved(Request(None, 2)), 11.5)
    message = "request 2 withdrew the swap to b"
    assert actions == [EmitEvent("Normal", "SwapWithdrawn", message)]
    assert state.last_swap == LastSwap(
        "a", "b", 2, 10.0, 1.5, Outcome.WITHDRAWN, "Withdrawn", message)


def test_a_swap_past_its_budget_is_abandoned_in_a_warning_and_in_last_swap() -> None:
    state, _ = run(resident(), [(10.0, RequestObserved(Request("b", 5))),
                                (11.0, IdleResult("a", Verdict.IDLE)),
                                (12.0, MembersObserved(pods())),
                                (13.0, MembersObserved(loading(b=1)))])
    state, actions = s.step(state, Tick(), 110.0)
    message = "b not Ready within swapBudget 100s"
    assert actions[:4] == [
        Scale("b", 0),
        ClearRequest(5),
        EmitEvent("Warning", "SwapAbandoned", f"SwapBudgetExceeded: {message}"),
        RecordFailure("b", s.SWAP_BUDGET_EXCEEDED),
    ]
    assert state.last_swap == LastSwap(
        "a", "b", 5, 10.0, 100.0, Outcome.ABANDONED, s.SWAP_BUDGET_EXCEEDED, message)


def test_an_incumbent_whose_idle_probe_never_answers_is_abandoned_as_draining() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 5)), 10.0)
    state, actions = s.step(state, Tick(), 110.0)
    message = "a not drained within swapBudget 100s (draining)"
    assert actions == [
        ClearRequest(5),
        EmitEvent("Warning", "SwapAbandoned", f"SwapBudgetExceeded: {message}"),
        RecordFailure("b", s.SWAP_BUDGET_EXCEEDED),
    ]
    assert state.resident == "a" and state.last_swap is not None
    assert state.last_swap.message == message


def test_an_incumbent_that_can_never_be_probed_fails_the_swap_saying_why() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 3)), 10.0)
    state, actions = s.step(state, IdleResult("a", Verdict.UNSUPPORTED, "generic runtime"), 11.0)
    message = "a can never be probed for idleness: generic runtime"
    assert actions == [
        ClearRequest(3),
        EmitEvent("Warning", "SwapFailed", f"IdleProbeUnsupported: {message}"),
        RecordFailure("b", s.IDLE_PROBE_UNSUPPORTED),
    ]
    assert state.last_swap == LastSwap(
        "a", "b", 3, 10.0, 1.0, Outcome.FAILED, s.IDLE_PROBE_UNSUPPORTED, message)


def test_a_reclaim_is_announced_once_the_member_was_found_idle() -> None:
    state, _ = s.step(resident("b", since=0.0, config=RECLAIM), Tick(), 30.0)
    state, actions = s.step(state, IdleResult("b", Verdict.IDLE), 31.0)
    assert actions == [
        EmitEvent("Normal", "SwapStarted", "swapping b -> a: reclaimed after 30s"),
        Scale("b", 0),
        Scale("a", 1),
    ]


@pytest.mark.parametrize(("detail", "said"), [
    ("", "b can never be probed for activity, so idleUnloadAfter leaves it resident"),
    ("generic runtime", "b can never be probed for activity, so idleUnloadAfter leaves it "
                        "resident: generic runtime"),
])
def test_a_member_that_can_never_be_probed_for_activity_is_told_once_and_not_probed_again(
    detail: str, said: str
) -> None:
    state, actions = s.step(resident("b", since=0.0, config=IDLE), Tick(), 0.0)
    assert actions == [ProbeActivity("b")]
    state, actions = s.step(state, ActivityResult("b", Verdict.UNSUPPORTED, "", detail), 1.0)
    assert actions == [EmitEvent("Warning", s.IDLE_UNLOAD_UNSUPPORTED, said)]
    assert s.next_wakeup(state) is None


def test_an_idle_unload_says_how_long_the_member_served_nothing() -> None:
    state, _ = run(resident("b", since=0.0, config=IDLE), [
        (0.0, Tick()), (0.0, ActivityResult("b", Verdict.IDLE, "0:7")),
        (5.0, Tick()), (5.0, ActivityResult("b", Verdict.IDLE, "0:7")),
        (10.0, Tick()), (10.0, ActivityResult("b", Verdict.IDLE, "0:7")),
        (15.0, Tick()), (15.0, ActivityResult("b", Verdict.IDLE, "0:7")),
        (20.0, Tick()),
    ])
    state, actions = s.step(state, ActivityResult("b", Verdict.IDLE, "0:7"), 21.0)
    assert actions == [
        Scale("b", 0),
        EmitEvent("Normal", s.IDLE_UNLOADED, "b served nothing for 21s (idleUnloadAfter 20s): "
                  "unloaded, the pool is Cold until a request comes"),
        RecordIdleUnload("b"),
    ]
    assert (state.resident, state.resident_since) == (None, None)  # status shows neither
