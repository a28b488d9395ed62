"""The pool's swap state machine, case by case."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import pytest

from reconciler import swap as s
from reconciler.swap import (
    ClearRequest,
    EmitEvent,
    IdleResult,
    MemberPods,
    MembersObserved,
    Outcome,
    Phase,
    PoolConfig,
    PoolState,
    ProbeIdle,
    Problem,
    RecordDeferral,
    RecordFailure,
    RecordSwap,
    Request,
    RequestObserved,
    Scale,
    SpecObserved,
    Tick,
    Verdict,
)

pytestmark = pytest.mark.unit

A = TypeVar("A")

CONFIG = PoolConfig(members=("a", "b", "c"), default="a", swap_budget=100.0, probe_interval=2.0)


def pods(**running: int) -> MemberPods:
    """Pods per member; every pod counted is scheduled and Ready."""
    return MemberPods(pods=dict(running), scheduled=dict(running), ready=dict(running))


def loading(**running: int) -> MemberPods:
    """Pods that exist and are scheduled but not Ready yet."""
    return MemberPods(pods=dict(running), scheduled=dict(running), ready={})


def resident(member: str = "a", since: float = 0.0, config: PoolConfig = CONFIG) -> PoolState:
    return PoolState(
        config=config,
        resident=member,
        resident_since=since,
        observed=pods(**{member: 1}),
    )


def run(
    state: PoolState, events: Sequence[tuple[float, s.Event]]
) -> tuple[PoolState, list[s.Action]]:
    actions: list[s.Action] = []
    for now, event in events:
        state, more = s.step(state, event, now)
        actions += more
    return state, actions


def kinds(actions: Sequence[s.Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def test_nothing_happens_before_the_members_were_observed() -> None:
    state, actions = s.step(PoolState(config=CONFIG), Tick(), 0.0)
    assert actions == []
    assert state.swap is None


def test_a_cold_pool_without_a_default_stays_cold() -> None:
    config = replace(CONFIG, default=None)
    state, actions = s.step(PoolState(config=config), MembersObserved(pods()), 0.0)
    assert actions == []
    assert s.phase_of(state) == "Cold"


def test_a_cold_pool_loads_its_default_and_turns_ready() -> None:
    state, actions = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    assert kinds(actions, Scale) == [Scale("a", 1)]
    assert state.swap is not None and state.swap.phase is Phase.LOADING
    assert s.desired_replicas(state) == {"a": 1, "b": 0, "c": 0}
    assert s.phase_of(state) == "Swapping"

    state, actions = run(
        state, [(3.0, MembersObserved(loading(a=1))), (5.0, MembersObserved(pods(a=1)))]
    )
    assert state.swap is None
    assert state.resident == "a" and state.resident_since == 5.0
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.SUCCEEDED
    assert state.last_swap.generation is None and state.last_swap.duration == 5.0
    [record] = kinds(actions, RecordSwap)
    assert record == RecordSwap(None, "a", 5.0, (("unload", 0.0), ("schedule", 3.0), ("load", 2.0)))
    assert s.phase_of(state) == "Ready"


def test_a_cold_pool_with_a_stray_member_unloads_it_before_loading_the_default() -> None:
    state, actions = s.step(PoolState(config=CONFIG), MembersObserved(pods(b=1)), 0.0)
    assert kinds(actions, Scale) == [Scale("b", 0), Scale("a", 1)]  # a staged, gated
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    assert s.released(state) == frozenset()
    state, actions = s.step(state, MembersObserved(pods()), 1.0)
    assert kinds(actions, Scale) == []
    assert s.released(state) == {"a"}


def test_a_request_for_another_member_probes_the_incumbent_first() -> None:
    state, actions = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    assert kinds(actions, ProbeIdle) == [ProbeIdle("a")]
    assert kinds(actions, Scale) == []
    assert state.swap is not None and state.swap.phase is Phase.DRAINING
    assert s.desired_replicas(state) == {"a": 1, "b": 0, "c": 0}


def test_a_request_for_the_resident_changes_nothing() -> None:
    state, actions = s.step(resident(), RequestObserved(Request("a", 4)), 10.0)
    assert actions == []
    assert state.swap is None


def test_an_idle_incumbent_is_unloaded_and_the_target_loads_only_once_its_pods_are_gone() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    assert s.released(state) == {"a"}
    state, actions = s.step(state, IdleResult("a", Verdict.IDLE), 11.0)
    # b is staged as a unloads: its pod is created, gated, and placed only once released
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("b", 1)]
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    assert s.desired_replicas(state) == {"a": 0, "b": 1, "c": 0}
    assert s.released(state) == frozenset()

    # a terminating pod still holds the GPU; b's gated pod waits
    staged = MemberPods(pods={"a": 1, "b": 1}, terminating={"a": 1})
    state, actions = s.step(state, MembersObserved(staged), 12.0)
    assert kinds(actions, Scale) == [] and s.released(state) == frozenset()
    state, actions = s.step(state, MembersObserved(MemberPods(pods={"b": 1})), 13.0)
    assert kinds(actions, Scale) == []
    assert state.resident is None and state.swap is not None
    assert state.swap.phase is Phase.LOADING
    assert s.desired_replicas(state) == {"a": 0, "b": 1, "c": 0}
    assert s.released(state) == {"b"}

    state, actions = s.step(state, MembersObserved(pods(b=1)), 20.0)
    assert state.resident == "b" and state.swap is None
    assert state.last_swap == s.LastSwap("a", "b", 1, 10.0, 10.0, Outcome.SUCCEEDED, phases=(
        ("drain", 1.0), ("unload", 2.0), ("schedule", 7.0), ("load", 0.0)))
    [record] = kinds(actions, RecordSwap)
    assert dict(record.phases) == {"drain": 1.0, "unload": 2.0, "schedule": 7.0, "load": 0.0}
    assert EmitEvent("Normal", "SwapCompleted", "b is resident (from a, 10.0s)") in actions


@pytest.mark.parametrize(
    ("verdict", "reason"),
    [(Verdict.BUSY, s.PODS_BUSY), (Verdict.FAILED, s.IDLE_CHECK_FAILED)],
)
def test_a_busy_or_unprobeable_incumbent_defers_and_is_probed_again(
    verdict: Verdict, reason: str
) -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, actions = s.step(state, IdleResult("a", verdict, "detail"), 11.0)
    assert kinds(actions, Scale) == []
    assert kinds(actions, RecordDeferral) == [RecordDeferral(reason)]
    assert state.swap is not None and state.swap.deferral is not None
    assert state.swap.deferral.reason == reason
    assert s.next_wakeup(state) == 13.0

    state, actions = s.step(state, Tick(), 12.0)
    assert actions == []  # not before the probe interval
    state, actions = s.step(state, Tick(), 13.0)
    assert actions == [ProbeIdle("a")]
    # the same answer again is neither counted nor announced twice
    state, actions = s.step(state, IdleResult("a", verdict, "detail"), 13.5)
    assert actions == []
    state, actions = s.step(state, IdleResult("a", Verdict.IDLE), 16.0)
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("b", 1)]


def test_an_incumbent_that_can_never_be_probed_fails_the_swap_at_once() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 3)), 10.0)
    state, actions = s.step(state, IdleResult("a", Verdict.UNSUPPORTED, "generic runtime"), 11.0)
    assert state.swap is None and state.resident == "a"
    assert state.last_swap is not None
    assert state.last_swap.outcome is Outcome.FAILED
    assert state.last_swap.reason == s.IDLE_PROBE_UNSUPPORTED
    assert ClearRequest(3) in actions
    assert kinds(actions, Scale) == []
    assert RecordFailure("b", s.IDLE_PROBE_UNSUPPORTED) in actions
    # the answered request is not tried again
    state, actions = s.step(state, Tick(), 12.0)
    assert actions == []


def test_min_residency_defers_until_served() -> None:
    config = replace(CONFIG, min_residency=30.0)
    state, actions = s.step(
        resident(since=0.0, config=config), RequestObserved(Request("b", 1)), 10.0
    )
    assert kinds(actions, ProbeIdle) == []
    assert kinds(actions, RecordDeferral) == [RecordDeferral(s.MIN_RESIDENCY)]
    assert s.next_wakeup(state) == 30.0
    state, actions = s.step(state, Tick(), 29.0)
    assert kinds(actions, ProbeIdle) == []
    state, actions = s.step(state, Tick(), 30.0)
    assert actions == [ProbeIdle("a")]


def test_a_target_that_never_turns_ready_is_abandoned_at_swap_budget() -> None:
    state, _ = run(
        resident(),
        [
            (10.0, RequestObserved(Request("b", 5))),
            (11.0, IdleResult("a", Verdict.IDLE)),
            (12.0, MembersObserved(pods())),
            (13.0, MembersObserved(loading(b=1))),
        ],
    )
    assert s.next_wakeup(state) == 110.0
    state, actions = s.step(state, Tick(), 109.9)
    assert actions == []
    state, actions = s.step(state, Tick(), 110.0)
    assert Scale("b", 0) in actions
    assert ClearRequest(5) in actions
    assert RecordFailure("b", s.SWAP_BUDGET_EXCEEDED) in actions
    assert state.last_swap is not None
    assert state.last_swap.outcome is Outcome.ABANDONED
    assert state.last_swap.generation == 5
    assert state.last_swap.reason == s.SWAP_BUDGET_EXCEEDED
    assert state.resident is None
    # the pool is cold again: with the abandoned request answered, it loads its default
    # once b's pod is gone, and a later request swaps normally.
    assert state.swap is not None and state.swap.to == "a" and state.swap.phase is Phase.UNLOADING
    state, actions = run(
        state, [(111.0, MembersObserved(pods())), (115.0, MembersObserved(pods(a=1)))]
    )
    assert state.resident == "a"
    state, actions = s.step(state, RequestObserved(Request("c", 7)), 120.0)
    assert actions[-1] == ProbeIdle("a")


def test_an_abandoned_request_is_not_cleared_when_a_newer_one_replaced_it() -> None:
    state, _ = run(
        resident(),
        [
            (10.0, RequestObserved(Request("b", 5))),
            (11.0, IdleResult("a", Verdict.IDLE)),
            (12.0, MembersObserved(pods())),
            (20.0, RequestObserved(Request("c", 6))),
        ],
    )
    state, actions = s.step(state, Tick(), 110.0)
    assert kinds(actions, ClearRequest) == []
    assert state.swap is not None and state.swap.to == "c"  # the newer request goes next


def test_an_incumbent_busy_for_the_whole_budget_stays_resident() -> None:
    state, _ = run(
        resident(),
        [(10.0, RequestObserved(Request("b", 2))), (11.0, IdleResult("a", Verdict.BUSY))],
    )
    state, actions = s.step(state, Tick(), 110.0)
    assert state.resident == "a" and state.swap is None
    assert kinds(actions, Scale) == []
    assert ClearRequest(2) in actions
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.ABANDONED
    assert "PodsBusy" in (state.last_swap.message or "")


@pytest.mark.parametrize("member", [None, "a"])
def test_a_withdrawal_before_unloading_ends_the_swap(member: str | None) -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, actions = s.step(state, RequestObserved(Request(member, 2)), 11.0)
    assert state.swap is None and state.resident == "a"
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.WITHDRAWN
    assert state.last_swap.generation == 2
    assert kinds(actions, Scale) == [] and kinds(actions, ClearRequest) == []
    # a late idle answer does nothing
    state, actions = s.step(state, IdleResult("a", Verdict.IDLE), 12.0)
    assert actions == []


def test_a_withdrawal_once_unloading_began_is_not_honoured() -> None:
    state, _ = run(
        resident(),
        [(10.0, RequestObserved(Request("b", 1))), (11.0, IdleResult("a", Verdict.IDLE))],
    )
    state, actions = s.step(state, RequestObserved(Request(None, 2)), 12.0)
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    state, actions = run(
        state, [(13.0, MembersObserved(pods())), (14.0, MembersObserved(pods(b=1)))]
    )
    assert state.resident == "b"
    # afterwards the withdrawal (member null) asks for nothing
    state, actions = s.step(state, Tick(), 15.0)
    assert actions == []


def test_a_newer_request_while_draining_retargets_the_swap() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, _ = s.step(state, RequestObserved(Request("c", 2)), 11.0)
    assert state.swap is not None and (state.swap.to, state.swap.generation) == ("c", 2)
    state, actions = s.step(state, IdleResult("a", Verdict.IDLE), 12.0)
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("c", 1)]
    state, actions = s.step(state, MembersObserved(pods()), 13.0)
    assert actions == [] and s.released(state) == {"c"}


def test_a_request_for_a_non_member_is_answered_and_cleared() -> None:
    state, actions = s.step(resident(), RequestObserved(Request("zzz", 4)), 10.0)
    assert ClearRequest(4) in actions
    assert state.last_swap is not None and state.last_swap.reason == s.NOT_A_MEMBER
    assert kinds(actions, Scale) == []
    state, actions = s.step(state, Tick(), 11.0)
    assert actions == []


def test_a_problem_in_the_spec_stalls_everything_until_fixed() -> None:
    problem = Problem("MemberNotFound", "ModelServer b not found")
    state, actions = s.step(resident(), SpecObserved(CONFIG, 2, problem), 1.0)
    assert actions == [EmitEvent("Warning", "MemberNotFound", "ModelServer b not found")]
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 2.0)
    assert actions == []
    assert s.desired_replicas(state) is None
    assert s.phase_of(state) == "Degraded"
    # the same problem observed again is not announced again
    state, actions = s.step(state, SpecObserved(CONFIG, 2, problem), 3.0)
    assert actions == []
    state, actions = s.step(state, SpecObserved(CONFIG, 3, None), 4.0)
    assert actions[0] == EmitEvent("Normal", "SpecValid", "the pool's spec is valid again")
    assert actions[-1] == ProbeIdle("a")
    assert state.generation == 3


def test_a_stale_idle_answer_is_ignored() -> None:
    state, actions = s.step(resident(), IdleResult("a", Verdict.IDLE), 1.0)
    assert actions == [] and state.swap is None


def test_an_incumbent_without_pods_needs_no_probe() -> None:
    state = replace(resident(), observed=pods())
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 10.0)
    assert kinds(actions, ProbeIdle) == []
    assert Scale("b", 1) in actions


RECLAIM = replace(CONFIG, policy="reclaim", reclaim_after=30.0)


def test_reclaim_returns_an_idle_member_to_the_default_after_reclaim_after() -> None:
    state = resident("b", since=0.0, config=RECLAIM)
    state, actions = s.step(state, Tick(), 29.0)
    assert actions == [] and s.next_wakeup(state) == 30.0
    state, actions = s.step(state, Tick(), 30.0)
    assert actions == [ProbeIdle("b")]  # a check, not yet a swap: nothing announced
    assert s.visible_swap(state) is None and s.phase_of(state) == "Ready"
    state, actions = s.step(state, IdleResult("b", Verdict.IDLE), 31.0)
    assert kinds(actions, Scale) == [Scale("b", 0), Scale("a", 1)]
    assert [a.reason for a in kinds(actions, EmitEvent)] == ["SwapStarted"]
    state, actions = run(state, [(32.0, MembersObserved(pods())),
                                 (35.0, MembersObserved(pods(a=1)))])
    assert state.resident == "a" and state.last_swap is not None
    assert (state.last_swap.from_, state.last_swap.outcome) == ("b", Outcome.SUCCEEDED)
    assert s.next_wakeup(state) is None  # the default is never reclaimed from


def test_reclaim_leaves_a_busy_member_and_looks_again_later() -> None:
    state, _ = run(resident("b", since=0.0, config=RECLAIM), [(30.0, Tick())])
    state, actions = s.step(state, IdleResult("b", Verdict.BUSY), 31.0)
    assert actions == [] and state.swap is None and state.resident == "b"
    assert kinds(actions, RecordDeferral) == []
    assert s.next_wakeup(state) == 61.0
    state, actions = s.step(state, Tick(), 61.0)
    assert actions == [ProbeIdle("b")]


def test_a_request_calls_a_reclaim_off() -> None:
    state = resident("b", since=0.0, config=RECLAIM)
    state = replace(state, request=Request("b", 3), answered=3)
    state, _ = s.step(state, Tick(), 30.0)
    assert state.swap is not None and state.swap.reclaim
    state, actions = s.step(state, RequestObserved(Request("c", 4)), 30.5)
    # the reclaim is dropped and the request is served instead
    assert state.swap is not None and not state.swap.reclaim and state.swap.to == "c"
    assert actions[-1] == ProbeIdle("b")


def test_sticky_never_reclaims() -> None:
    state, actions = s.step(resident("b", since=0.0), Tick(), 1000.0)
    assert actions == [] and s.next_wakeup(state) is None


def test_a_higher_priority_member_does_not_wait_out_min_residency() -> None:
    config = replace(CONFIG, min_residency=30.0, priorities={"a": 0, "b": 5, "c": 0})
    state, actions = s.step(resident("a", since=0.0, config=config),
                            RequestObserved(Request("b", 1)), 10.0)
    assert actions[-1] == ProbeIdle("a")  # straight to draining: b outranks a
    assert kinds(actions, RecordDeferral) == []
    # an equal one waits, and once retargeted to a higher one stops waiting
    state, actions = s.step(resident("a", since=0.0, config=config),
                            RequestObserved(Request("c", 1)), 10.0)
    assert kinds(actions, RecordDeferral) == [RecordDeferral(s.MIN_RESIDENCY)]
    state, actions = s.step(state, RequestObserved(Request("b", 2)), 11.0)
    assert actions == [ProbeIdle("a")]
    assert state.swap is not None and state.swap.deferral is None


def test_members_not_seen_yet_keep_a_new_pool_cold_until_they_come_or_time_is_up() -> None:
    cold = PoolState(config=CONFIG, observed=pods())
    pending = Problem("WaitingForMembers", "waiting for ModelServer: b", pending=True)
    state, actions = s.step(cold, SpecObserved(CONFIG, 1, pending), 1.0)
    assert actions == []  # no Warning for what is expected to pass
    assert s.phase_of(state) == "Cold"
    assert s.desired_replicas(state) is None  # and nothing is scaled meanwhile
    # the members came: no "valid again" Event, the default loads
    arrived, actions = s.step(state, SpecObserved(CONFIG, 1, None), 2.0)
    assert arrived.swap is not None and arrived.swap.to == "a"
    assert kinds(actions, EmitEvent) == [
        EmitEvent("Normal", "SwapStarted", "swapping (none) -> a for the pool's default")]
    assert Scale("a", 1) in actions
    # they did not come in time: now a problem proper, announced once
    missing = Problem("MemberNotFound", "ModelServer not found: b")
    stalled, actions = s.step(state, SpecObserved(CONFIG, 1, missing), 4.0)
    assert actions == [EmitEvent("Warning", "MemberNotFound", "ModelServer not found: b")]
    assert s.phase_of(stalled) == "Degraded"


def refused(member: str, why: str) -> MemberPods:
    """A pod of `member` that exists but that the scheduler would not place."""
    return MemberPods(pods={member: 1}, unschedulable={member: why})


def test_a_target_the_scheduler_refuses_is_reported_once_and_cleared_when_placed() -> None:
    why = "a cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    state, actions = s.step(state, MembersObserved(refused("a", why)), 1.0)
    assert kinds(actions, EmitEvent) == [EmitEvent("Warning", s.UNSCHEDULABLE, why)]
    assert state.swap is not None and state.swap.unschedulable == why
    # the same refusal seen again, or one with other words, posts nothing more
    state, actions = s.step(state, MembersObserved(refused("a", why)), 2.0)
    assert kinds(actions, EmitEvent) == []
    state, actions = s.step(state, MembersObserved(refused("a", why + " held by x")), 3.0)
    assert kinds(actions, EmitEvent) == []
    assert state.swap is not None and state.swap.unschedulable == why + " held by x"
    state, actions = s.step(state, MembersObserved(loading(a=1)), 4.0)
    assert state.swap is not None and state.swap.unschedulable is None
    assert kinds(actions, EmitEvent) == []


def test_a_target_whose_container_fails_is_reported_once_and_cleared_when_ready() -> None:
    crash = ("CrashLoopBackOff", "a is not starting: container model: CrashLoopBackOff "
             "(exited 1, Error)")
    pull = ("ImagePullBackOff", "a is not starting: container model: ImagePullBackOff")
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    state, actions = s.step(state, MembersObserved(MemberPods(
        pods={"a": 1}, scheduled={"a": 1}, failing={"a": crash})), 1.0)
    assert kinds(actions, EmitEvent) == [EmitEvent("Warning", *crash)]
    assert state.swap is not None and state.swap.failing == crash
    # a new reason or new words update what the pool says, with no second Event
    state, actions = s.step(state, MembersObserved(MemberPods(
        pods={"a": 1}, scheduled={"a": 1}, failing={"a": pull})), 2.0)
    assert kinds(actions, EmitEvent) == [] and state.swap is not None
    assert state.swap.failing == pull
    state, actions = s.step(state, MembersObserved(loading(a=1)), 3.0)
    assert state.swap is not None and state.swap.failing is None
    state, _ = s.step(state, MembersObserved(pods(a=1)), 4.0)
    assert state.resident == "a"


@pytest.mark.parametrize(("observed", "reason"), [
    (refused("a", "a cannot be scheduled: 0/1 nodes are available"), "Unschedulable"),
    (MemberPods(not_created={"a": 'a cannot be created: pods "a-1" is forbidden'}),
     "FailedCreate"),
    (MemberPods(pods={"a": 1}, failing={"a": ("ErrImagePull", "a is not starting: ...")}),
     "ErrImagePull"),
])
def test_a_swap_abandoned_while_its_target_is_refused_says_why(
    observed: MemberPods, reason: str
) -> None:
    why = (observed.unschedulable or observed.not_created or
           {m: text for m, (_, text) in observed.failing.items()})["a"]
    state, _ = run(PoolState(config=CONFIG), [(0.0, MembersObserved(pods())),
                                              (1.0, MembersObserved(observed))])
    state, _ = s.step(state, Tick(), 100.0)
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.ABANDONED
    assert state.last_swap.message == f"a not Ready within swapBudget 100s ({reason}: {why})"


def not_created(member: str, why: str) -> MemberPods:
    """No pod of `member`: admission refused the ones its ReplicaSet tried to create."""
    return MemberPods(not_created={member: why})


def test_a_target_whose_pods_cannot_be_created_is_reported_once_and_cleared_when_one_is() -> None:
    why = 'a cannot be created: pods "a-1" is forbidden: exceeded quota: no-pods'
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    state, actions = s.step(state, MembersObserved(not_created("a", why)), 1.0)
    assert kinds(actions, EmitEvent) == [EmitEvent("Warning", s.FAILED_CREATE, why)]
    assert state.swap is not None and state.swap.not_created == why
    state, actions = s.step(state, MembersObserved(not_created("a", why)), 2.0)
    assert kinds(actions, EmitEvent) == []
    # A pod at last (the condition may linger a moment): the failure is over.
    lingering = MemberPods(pods={"a": 1}, not_created={"a": why})
    state, actions = s.step(state, MembersObserved(lingering), 3.0)
    assert state.swap is not None and state.swap.not_created is None
    assert kinds(actions, EmitEvent) == []
    state, _ = s.step(state, MembersObserved(pods(a=1)), 4.0)
    assert state.resident == "a" and state.swap is None


def test_an_abandoned_swap_scales_its_target_down_in_a_pool_without_a_default() -> None:
    """Nothing else would: with no default to load, no later unload touches the target."""
    config = replace(CONFIG, default=None)
    state, _ = run(
        resident(config=config),
        [
            (10.0, RequestObserved(Request("b", 5))),
            (11.0, IdleResult("a", Verdict.IDLE)),
            (12.0, MembersObserved(pods())),
            (13.0, MembersObserved(loading(b=1))),
        ],
    )
    state, actions = s.step(state, Tick(), 110.0)
    assert kinds(actions, Scale) == [Scale("b", 0)]
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.ABANDONED
    assert state.swap is None and state.resident is None
    assert s.desired_replicas(state) == {"a": 0, "b": 0, "c": 0}
    assert s.phase_of(state) == "Cold"
    # it stays cold and scales nothing more while b's pod goes
    state, actions = s.step(state, MembersObserved(loading(b=1)), 111.0)
    assert actions == [] and state.swap is None


IDLE = replace(CONFIG, idle_unload_after=20.0)


def probe_activity(state: PoolState, now: float, verdict: Verdict = Verdict.IDLE,
                   mark: str = "0:7") -> tuple[PoolState, list[s.Action]]:
    """Step to `now`, which must be when the resident is probed, and answer the probe."""
    state, actions = s.step(state, Tick(), now)
    assert s.ProbeActivity(state.resident or "") in actions, (now, actions)
    return s.step(state, s.ActivityResult(state.resident or "", verdict, mark), now)


def test_idle_unload_probes_every_quarter_and_unloads_a_member_that_served_nothing() -> None:
    assert IDLE.activity_interval == 5.0
    assert replace(IDLE, idle_unload_after=3600.0).activity_interval == s.MAX_ACTIVITY_INTERVAL
    state = resident("b", since=0.0, config=IDLE)
    state, _ = probe_activity(state, 0.0)  # the first reading: the window starts at 0
    assert s.next_wakeup(state) == 5.0
    for now in (5.0, 10.0, 15.0):
        state, actions = probe_activity(state, now)
        assert kinds(actions, Scale) == [] and state.resident == "b"
    state, actions = probe_activity(state, 20.0)
    assert kinds(actions, Scale) == [Scale("b", 0)]
    assert [a.reason for a in kinds(actions, EmitEvent)] == [s.IDLE_UNLOADED]
    assert s.RecordIdleUnload("b") in actions
    assert state.resident is None and state.idle_unloaded == s.IdleUnload("b", 20.0, 20.0)
    assert s.phase_of(state) == "Cold" and s.desired_replicas(state) == {"a": 0, "b": 0, "c": 0}
    # Cold stays Cold: the default is not loaded again, nothing is probed
    state, actions = s.step(state, MembersObserved(pods()), 21.0)
    state, more = s.step(state, Tick(), 100.0)
    assert actions + more == [] and state.swap is None and s.next_wakeup(state) is None


@pytest.mark.parametrize(
    ("verdict", "mark"),
    [(Verdict.IDLE, "0:8"), (Verdict.BUSY, "0:7"), (Verdict.FAILED, "")],
    ids=["served", "busy", "probe-failed"],
)
def test_activity_or_a_failed_probe_keeps_the_resident(verdict: Verdict, mark: str) -> None:
    state = resident("b", since=0.0, config=IDLE)
    state, _ = probe_activity(state, 0.0)
    state, _ = probe_activity(state, 15.0, verdict, mark)
    state, actions = probe_activity(state, 20.0, Verdict.IDLE, mark or "0:7")
    assert kinds(actions, Scale) == [] and state.resident == "b"
    # activity (or what could not be seen) at 15: a full window from there
    state, actions = probe_activity(state, 25.0, Verdict.IDLE, mark or "0:7")
    assert kinds(actions, Scale) == []
    state, actions = probe_activity(state, 30.0, Verdict.IDLE, mark or "0:7")
    assert kinds(actions, Scale) == []
    state, actions = probe_activity(state, 35.0, Verdict.IDLE, mark or "0:7")
    assert kinds(actions, Scale) == [Scale("b", 0)]


def test_a_member_that_can_never_be_probed_is_said_so_once_and_stays() -> None:
    state = resident("b", since=0.0, config=IDLE)
    state, actions = probe_activity(state, 0.0, Verdict.UNSUPPORTED, "")
    assert [a.reason for a in kinds(actions, EmitEvent)] == [s.IDLE_UNLOAD_UNSUPPORTED]
    state, actions = s.step(state, Tick(), 1000.0)
    assert actions == [] and state.resident == "b" and s.next_wakeup(state) is None


def test_a_request_after_an_idle_unload_waits_for_the_members_own_terminating_pod() -> None:
    state = resident("b", since=0.0, config=IDLE)
    state, _ = probe_activity(state, 0.0)
    state, _ = probe_activity(state, 20.0)
    assert state.resident is None
    going = MemberPods(pods={"b": 1}, scheduled={"b": 1}, ready={}, terminating={"b": 1})
    state, actions = run(state, [(20.5, MembersObserved(going)),
                                 (21.0, RequestObserved(Request("b", 4)))])
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    assert state.idle_unloaded is None  # a request ends the Cold of idleness
    assert Scale("b", 1) in actions  # a new pod, staged and gated
    assert s.released(state) == frozenset()  # its old pod still holds the GPU
    state, actions = s.step(state, MembersObserved(MemberPods(pods={"b": 1})), 23.0)
    assert s.released(state) == {"b"}


def test_a_swap_stops_the_activity_probes_and_a_new_resident_starts_a_new_window() -> None:
    state = resident("a", since=0.0, config=IDLE)
    state, _ = probe_activity(state, 0.0)
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 12.0)
    assert state.activity is None and actions[-1] == ProbeIdle("a")
    state, actions = run(state, [(13.0, IdleResult("a", Verdict.IDLE)),
                                 (14.0, MembersObserved(pods())),
                                 (16.0, MembersObserved(pods(b=1)))])
    assert state.resident == "b" and actions[-1] == s.ProbeActivity("b")
    state, actions = s.step(state, s.ActivityResult("b", Verdict.IDLE, "0:7"), 16.0)
    state, actions = probe_activity(state, 31.0)
    assert kinds(actions, Scale) == []  # b's window began at 16
    state, actions = probe_activity(state, 36.0)
    assert kinds(actions, Scale) == [Scale("b", 0)]


def test_only_the_member_that_holds_the_slot_is_released_and_nobody_under_a_problem() -> None:
    state = resident()
    assert s.released(state) == {"a"}
    state, _ = s.step(state, RequestObserved(Request("b", 1)), 10.0)
    assert s.released(state) == {"a"}  # draining: a still serves
    state, _ = s.step(state, SpecObserved(CONFIG, 2, Problem("MemberNotFound", "c")), 11.0)
    assert s.released(state) == frozenset()  # a pod made now waits for the fix
    assert s.released(s.PoolState(config=CONFIG)) == frozenset()  # a cold pool
