"""The swap's rules at their corners: equal and unequal priorities, answers that come late
or twice, observations that linger, a spec that changes under a running pool.

test_swap.py walks each rule along its main path; the cases here sit where a rule could be
off by one comparison (mutation testing, scripts/mutation, found them unpinned).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from reconciler import swap as s
from reconciler.swap import (
    ActivityResult,
    EmitEvent,
    IdleResult,
    MemberPods,
    MembersObserved,
    Outcome,
    Phase,
    PoolState,
    ProbeActivity,
    ProbeIdle,
    Problem,
    RecordDeferral,
    RecordSwap,
    Request,
    RequestObserved,
    Scale,
    SpecObserved,
    Tick,
    Verdict,
)
from tests.unit.test_swap import CONFIG, IDLE, RECLAIM, kinds, loading, pods, resident, run

pytestmark = pytest.mark.unit


# --- minResidency and priorities ------------------------------------------------------


@pytest.mark.parametrize(("priorities", "waits"), [
    ({}, True),
    ({"a": 5, "b": 3}, True),  # b ranks above zero but below a
    ({"a": 3, "b": 3}, True),
    ({"b": 1}, False),  # a has no priority: it counts as 0
    ({"a": -1}, False),
])
def test_only_a_higher_priority_target_skips_min_residency(
    priorities: Mapping[str, int], waits: bool
) -> None:
    config = replace(CONFIG, min_residency=30.0, priorities=priorities)
    _, actions = s.step(resident(config=config), RequestObserved(Request("b", 1)), 10.0)
    assert (kinds(actions, RecordDeferral) == [RecordDeferral(s.MIN_RESIDENCY)]) is waits
    assert (ProbeIdle("a") in actions) is not waits


@pytest.mark.parametrize("min_residency", [0.5, 1.0])
def test_a_min_residency_of_a_second_or_less_is_still_served(min_residency: float) -> None:
    config = replace(CONFIG, min_residency=min_residency)
    state, actions = s.step(resident(config=config), RequestObserved(Request("b", 1)), 0.25)
    assert kinds(actions, RecordDeferral) == [RecordDeferral(s.MIN_RESIDENCY)]
    assert s.next_wakeup(state) == min_residency


def test_a_resident_restored_without_its_start_is_not_held_by_min_residency() -> None:
    """A status without residentSince (written by hand, or by an older reconciler)."""
    config = replace(CONFIG, min_residency=30.0)
    state = replace(resident(config=config), resident_since=None)
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 10.0)
    assert actions[-1] == ProbeIdle("a") and kinds(actions, RecordDeferral) == []


def test_a_retarget_to_a_higher_member_while_a_probe_is_out_waits_for_its_answer() -> None:
    config = replace(CONFIG, min_residency=30.0, priorities={"b": 5})
    state, actions = s.step(resident(config=config), RequestObserved(Request("b", 1)), 10.0)
    assert actions[-1] == ProbeIdle("a")  # b preempts: probed at once
    state, actions = s.step(state, RequestObserved(Request("c", 2)), 11.0)
    assert kinds(actions, RecordDeferral) == [RecordDeferral(s.MIN_RESIDENCY)]
    state, actions = s.step(state, RequestObserved(Request("b", 3)), 12.0)
    assert actions == []  # the probe sent at 10 is still out: not a second one
    assert state.swap is not None and (state.swap.to, state.swap.generation) == ("b", 3)
    assert state.swap.deferral is None  # status no longer says MinResidency
    state, actions = s.step(state, IdleResult("a", Verdict.IDLE), 13.0)
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("b", 1)]


# --- newer requests while draining ----------------------------------------------------


def test_a_newer_request_for_the_same_target_is_the_one_the_swap_answers() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, actions = s.step(state, RequestObserved(Request("b", 2)), 11.0)
    assert actions == []
    assert state.swap is not None and (state.swap.to, state.swap.generation) == ("b", 2)
    state, _ = run(state, [(12.0, IdleResult("a", Verdict.IDLE)),
                           (13.0, MembersObserved(pods())),
                           (14.0, MembersObserved(pods(b=1)))])
    assert state.last_swap is not None and state.last_swap.generation == 2
    assert state.answered == 2


def test_a_newer_request_for_a_non_member_while_draining_is_refused_after_the_swap() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    state, actions = s.step(state, RequestObserved(Request("zzz", 2)), 11.0)
    assert actions == []
    assert state.swap is not None and (state.swap.to, state.swap.generation) == ("b", 1)
    state, actions = run(state, [(12.0, IdleResult("a", Verdict.IDLE)),
                                 (13.0, MembersObserved(pods())),
                                 (14.0, MembersObserved(pods(b=1)))])
    assert state.resident == "b"
    assert state.last_swap is not None and state.last_swap.reason == s.NOT_A_MEMBER
    assert s.ClearRequest(2) in actions


# --- late and repeated answers --------------------------------------------------------


def test_a_deferred_swap_is_no_longer_deferred_once_the_incumbent_unloads() -> None:
    state, _ = run(resident(), [(10.0, RequestObserved(Request("b", 1))),
                                (11.0, IdleResult("a", Verdict.BUSY))])
    assert state.swap is not None and state.swap.deferral is not None
    state, _ = run(state, [(13.0, Tick()), (13.5, IdleResult("a", Verdict.IDLE))])
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    assert state.swap.deferral is None  # the SwapDeferred condition turns False


def test_an_idle_answer_once_unloading_began_changes_nothing() -> None:
    state, _ = run(resident(), [(10.0, RequestObserved(Request("b", 1))),
                                (11.0, IdleResult("a", Verdict.IDLE))])
    again, actions = s.step(state, IdleResult("a", Verdict.IDLE), 12.0)
    assert (again, actions) == (state, [])


def test_an_idle_answer_about_another_member_than_the_incumbent_is_ignored() -> None:
    state, _ = s.step(resident(), RequestObserved(Request("b", 1)), 10.0)
    again, actions = s.step(state, IdleResult("c", Verdict.IDLE), 11.0)
    assert (again, actions) == (state, [])


def test_a_reclaim_check_that_is_never_answered_is_called_off_without_a_failure() -> None:
    state, actions = s.step(resident("b", since=0.0, config=RECLAIM), Tick(), 30.0)
    assert actions == [ProbeIdle("b")]
    state, actions = s.step(state, Tick(), 130.0)  # the swap budget is 100
    assert actions == [] and state.last_swap is None
    assert state.swap is None and state.resident == "b"
    assert s.next_wakeup(state) == 160.0  # a reclaimAfter later


@pytest.mark.parametrize("config", [
    replace(CONFIG, reclaim_after=30.0),  # sticky, whatever reclaimAfter says
    replace(RECLAIM, reclaim_after=None),
    replace(RECLAIM, default="x"),  # no default among the members to go back to
], ids=["sticky", "no-reclaim-after", "default-not-a-member"])
def test_a_pool_that_cannot_reclaim_never_checks_its_resident(config: s.PoolConfig) -> None:
    state, actions = s.step(resident("b", since=0.0, config=config), Tick(), 1000.0)
    assert actions == [] and state.swap is None and s.next_wakeup(state) is None


def test_no_reclaim_is_scheduled_while_the_spec_has_a_problem() -> None:
    state = replace(resident("b", since=0.0, config=RECLAIM),
                    problem=Problem("MemberNotFound", "ModelServer c not found"))
    assert s.next_wakeup(state) is None


# --- the spec changing ----------------------------------------------------------------


def test_a_new_spec_applies_at_once_and_keeps_the_residents_start() -> None:
    state, actions = s.step(resident(since=5.0), SpecObserved(replace(CONFIG, swap_budget=10.0),
                                                              2), 6.0)
    assert actions == [] and state.generation == 2
    assert (state.resident, state.resident_since) == ("a", 5.0)
    state, _ = s.step(state, RequestObserved(Request("b", 1)), 7.0)
    assert s.next_wakeup(state) == 17.0  # the new budget


def test_a_resident_dropped_from_the_members_is_forgotten_and_no_longer_probed() -> None:
    config = replace(IDLE, default=None)
    state, actions = s.step(resident("b", since=0.0, config=config), Tick(), 0.0)
    assert actions == [ProbeActivity("b")]
    state, _ = s.step(state, ActivityResult("b", Verdict.IDLE, "0:7"), 0.0)
    assert s.next_wakeup(state) == 5.0
    state, actions = s.step(state, SpecObserved(replace(config, members=("a", "c")), 2), 1.0)
    assert actions == []
    assert (state.resident, state.resident_since) == (None, None)
    assert s.phase_of(state) == "Cold" and s.next_wakeup(state) is None


def test_idle_unload_turned_off_stops_the_activity_probes() -> None:
    state, _ = run(resident("b", since=0.0, config=IDLE),
                   [(0.0, Tick()), (0.0, ActivityResult("b", Verdict.IDLE, "0:7"))])
    assert s.next_wakeup(state) == 5.0
    state, actions = s.step(state, SpecObserved(CONFIG, 2), 1.0)
    assert actions == [] and s.next_wakeup(state) is None


def test_a_late_activity_answer_under_a_spec_problem_about_a_member_gone_scales_nothing(
) -> None:
    state, _ = run(resident("b", since=0.0, config=IDLE),
                   [(0.0, Tick()), (0.0, ActivityResult("b", Verdict.IDLE, "0:7")),
                    (20.0, Tick())])
    assert state.activity is not None and state.activity.probe_in_flight
    problem = Problem("MemberNotFound", "ModelServer c not found")
    state, _ = s.step(state, SpecObserved(replace(IDLE, members=("a", "c")), 2, problem), 20.0)
    state, actions = s.step(state, ActivityResult("b", Verdict.IDLE, "0:7"), 21.0)
    assert actions == []


# --- the pool's phase and what its pods show ------------------------------------------


def test_a_resident_without_a_ready_pod_is_degraded() -> None:
    state = replace(resident(), observed=loading(a=1))
    assert s.phase_of(state) == "Degraded"


def test_the_incumbents_start_is_gone_once_its_pods_are() -> None:
    state, _ = run(resident(since=2.0), [(10.0, RequestObserved(Request("b", 1))),
                                         (11.0, IdleResult("a", Verdict.IDLE))])
    assert (state.resident, state.resident_since) == ("a", 2.0)  # unloading, still there
    state, _ = s.step(state, MembersObserved(pods()), 12.0)
    assert (state.resident, state.resident_since) == (None, None)


def test_a_swap_abandoned_while_the_incumbent_unloads_leaves_the_pool_cold() -> None:
    config = replace(CONFIG, default=None)
    stuck = MemberPods(pods={"a": 1}, terminating={"a": 1})  # a pod that will not go
    state, _ = run(resident(since=2.0, config=config), [
        (10.0, RequestObserved(Request("b", 1))),
        (11.0, IdleResult("a", Verdict.IDLE)),
        (12.0, MembersObserved(stuck)),
    ])
    state, actions = s.step(state, Tick(), 110.0)
    assert Scale("b", 0) in actions
    assert (state.resident, state.resident_since, state.swap) == (None, None, None)
    assert s.phase_of(state) == "Cold"


def test_a_target_first_seen_ready_was_scheduled_then() -> None:
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    ready = MemberPods(pods={"a": 1}, ready={"a": 1})  # placed and Ready between two looks
    state, actions = s.step(state, MembersObserved(ready), 4.0)
    assert state.resident == "a"
    assert kinds(actions, RecordSwap) == [
        RecordSwap(None, "a", 4.0, (("unload", 0.0), ("schedule", 4.0), ("load", 0.0)))]


def test_a_placed_target_is_no_longer_unschedulable_whatever_lingers() -> None:
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    lingering = MemberPods(pods={"a": 1}, scheduled={"a": 1}, unschedulable={"a": "0/1 nodes"})
    state, actions = s.step(state, MembersObserved(lingering), 1.0)
    assert kinds(actions, EmitEvent) == []
    assert state.swap is not None and state.swap.unschedulable is None


def test_new_words_for_a_failed_create_post_no_second_event() -> None:
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    state, actions = s.step(state, MembersObserved(MemberPods(not_created={"a": "quota"})), 1.0)
    assert kinds(actions, EmitEvent) == [EmitEvent("Warning", s.FAILED_CREATE, "quota")]
    state, actions = s.step(state, MembersObserved(
        MemberPods(not_created={"a": "quota: no-pods"})), 2.0)
    assert kinds(actions, EmitEvent) == []
    assert state.swap is not None and state.swap.not_created == "quota: no-pods"


def test_a_ready_target_completes_without_a_warning_for_a_container_that_failed_before(
) -> None:
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    crashed = MemberPods(pods={"a": 1}, scheduled={"a": 1}, ready={"a": 1},
                         failing={"a": ("CrashLoopBackOff", "a restarted")})
    state, actions = s.step(state, MembersObserved(crashed), 1.0)
    assert state.resident == "a"
    assert [a.reason for a in kinds(actions, EmitEvent)] == ["SwapCompleted"]


# --- a default load answers no request ------------------------------------------------


def test_a_default_load_leaves_the_first_request_unanswered() -> None:
    state, _ = run(PoolState(config=CONFIG), [(0.0, MembersObserved(pods())),
                                              (5.0, MembersObserved(pods(a=1)))])
    assert state.resident == "a" and state.answered == 0
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 6.0)
    assert actions[-1] == ProbeIdle("a")


def test_an_abandoned_default_load_leaves_the_first_request_unanswered() -> None:
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    state, _ = s.step(state, Tick(), 100.0)
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.ABANDONED
    assert state.answered == 0
    state, _ = s.step(state, MembersObserved(pods(a=1)), 101.0)  # loaded again, in time
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 102.0)
    assert actions[-1] == ProbeIdle("a")


# --- idleUnloadAfter ------------------------------------------------------------------


@pytest.mark.parametrize("observed", [loading(b=1), MemberPods(pods={"b": 1})],
                         ids=["not-ready", "no-ready-count"])
def test_a_resident_without_a_ready_pod_is_not_probed_for_activity(observed: MemberPods) -> None:
    state = replace(resident("b", since=0.0, config=IDLE), observed=observed)
    state, actions = s.step(state, Tick(), 100.0)
    assert actions == [] and state.activity is None


def test_an_activity_answer_nobody_asked_for_changes_nothing() -> None:
    state, _ = run(resident("b", since=0.0, config=IDLE),
                   [(0.0, Tick()), (0.0, ActivityResult("b", Verdict.IDLE, "0:7"))])
    again, actions = s.step(state, ActivityResult("b", Verdict.IDLE, "0:7"), 1.0)
    assert (again, actions) == (state, [])


def test_the_idle_window_starts_when_the_resident_is_first_watched() -> None:
    """Not when the first answer comes: a slow probe does not lengthen the window."""
    state, _ = run(resident("b", since=0.0, config=IDLE),
                   [(0.0, Tick()), (5.0, ActivityResult("b", Verdict.IDLE, "0:7"))])
    for now in (10.0, 15.0):
        state, actions = run(state, [(now, Tick()),
                                     (now, ActivityResult("b", Verdict.IDLE, "0:7"))])
        assert kinds(actions, Scale) == []
    state, actions = run(state, [(20.0, Tick()), (20.0, ActivityResult("b", Verdict.IDLE, "0:7"))])
    assert kinds(actions, Scale) == [Scale("b", 0)]


def test_a_first_activity_reading_never_unloads_however_late_it_comes() -> None:
    state, _ = s.step(resident("b", since=0.0, config=IDLE), Tick(), 0.0)
    state, actions = s.step(state, ActivityResult("b", Verdict.IDLE, "0:7"), 60.0)
    assert actions == [] and state.resident == "b"


def test_an_idle_answer_after_a_busy_one_counts_from_the_busy_one() -> None:
    # probed every 15 s, unloaded after 10 s idle: each answer can decide alone
    config = replace(IDLE, idle_unload_after=10.0, probe_interval=15.0)
    state, _ = run(resident("b", since=0.0, config=config),
                   [(0.0, Tick()), (0.0, ActivityResult("b", Verdict.IDLE, "0:7")),
                    (15.0, Tick()), (15.0, ActivityResult("b", Verdict.BUSY, "0:9"))])
    state, actions = run(state, [(30.0, Tick()), (30.0, ActivityResult("b", Verdict.IDLE, "0:9"))])
    assert kinds(actions, Scale) == [Scale("b", 0)]
    assert state.idle_unloaded == s.IdleUnload("b", 30.0, 15.0)


def test_nothing_else_moves_while_a_swap_waits_for_its_target() -> None:
    state, _ = s.step(PoolState(config=CONFIG), MembersObserved(pods()), 0.0)
    assert state.swap is not None and state.swap.phase is Phase.LOADING
    state, actions = s.step(state, Tick(), 50.0)
    assert actions == [] and s.next_wakeup(state) == 100.0
