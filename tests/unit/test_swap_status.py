"""The pool's status as a projection of the swap state, and the state read back from it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler import pool_status as ps
from reconciler import swap as s
from reconciler.merge_patch import status_patch

pytestmark = pytest.mark.unit

CONFIG = s.PoolConfig(members=("a", "b"), default="a", swap_budget=60)
T0 = 1_800_000_000.0


def swapping() -> s.PoolState:
    state = s.PoolState(
        config=CONFIG,
        generation=3,
        resident="a",
        resident_since=T0,
        observed=s.MemberPods(pods={"a": 1}, scheduled={"a": 1}, ready={"a": 1}),
        request=s.Request("b", 7),
        last_swap=s.LastSwap(None, "a", None, T0 - 5, 5.0, s.Outcome.SUCCEEDED),
    )
    state, _ = s.step(state, s.Tick(), T0 + 10)
    state, _ = s.step(state, s.IdleResult("a", s.Verdict.BUSY), T0 + 11)
    return state


def test_a_swapping_pool_says_so() -> None:
    status = ps.pool_status(swapping(), None, T0 + 11)
    assert status["phase"] == "Swapping"
    assert status["residentMember"] == "a"
    assert status["swap"] == {
        "from": "a", "to": "b", "generation": 7, "phase": "Draining",
        "startedAt": "2027-01-15T08:00:10Z",
    }
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "Ready": ("False", "Swapping"),
        "Reconciling": ("True", "Swapping"),
        "Stalled": ("False", "Valid"),
        "SwapDeferred": ("True", "PodsBusy"),
    }
    assert status["members"] == [
        {"name": "a", "phase": "Ready", "resident": True},
        {"name": "b", "phase": "Stopped", "resident": False},
    ]
    assert status["observedGeneration"] == 3


def test_status_round_trips_through_restore() -> None:
    state = swapping()
    status = ps.pool_status(state, None, T0 + 11)
    status["request"] = {"member": "b", "generation": 7}
    restored = ps.restore(CONFIG, 3, status)
    assert restored.resident == "a" and restored.resident_since == T0
    assert restored.request == s.Request("b", 7)
    assert restored.swap is not None and state.swap is not None
    assert (restored.swap.to, restored.swap.phase, restored.swap.started) == (
        "b", s.Phase.DRAINING, state.swap.started,
    )
    assert restored.last_swap == state.last_swap


def test_an_answered_request_is_restored_as_answered() -> None:
    status = {
        "residentMember": "a",
        "request": {"member": "b", "generation": 4},
        "lastSwap": {"from": "a", "to": "b", "generation": 4, "start": "2027-01-15T08:00:00Z",
                     "durationSeconds": 60, "outcome": "Abandoned"},
    }
    state = replace(ps.restore(CONFIG, 1, status), observed=s.MemberPods(pods={"a": 1}))
    _, actions = s.step(state, s.Tick(), T0)
    assert actions == []


def test_the_patch_is_empty_when_nothing_changed_and_deletes_what_went() -> None:
    state = swapping()
    first = ps.pool_status(state, None, T0 + 11)
    assert status_patch(ps.pool_status(state, first, T0 + 50), first) == {}
    done = replace(state, swap=None)
    patch = status_patch(ps.pool_status(done, first, T0 + 50), first)
    assert patch["swap"] is None
    assert patch["phase"] == "Ready"
    assert "residentMember" not in patch


def test_a_new_pool_waiting_for_its_members_is_in_progress_not_stalled() -> None:
    pending = s.Problem("WaitingForMembers", "waiting for ModelServer: b", pending=True)
    state = s.PoolState(config=CONFIG, generation=1, problem=pending,
                        observed=s.MemberPods())
    status = ps.pool_status(state, None, T0)
    assert status["phase"] == "Cold"
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Reconciling"] == ("True", "WaitingForMembers")
    assert conditions["Stalled"] == ("False", "Valid")
    assert conditions["Ready"][0] == "False"
    stalled = replace(state, problem=s.Problem("MemberNotFound", "ModelServer not found: b"))
    status = ps.pool_status(stalled, None, T0)
    assert status["phase"] == "Degraded"
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Stalled"] == ("True", "MemberNotFound")


def test_a_target_whose_pods_cannot_be_created_shows_in_ready_and_reconciling() -> None:
    why = 'a cannot be created: pods "a-1" is forbidden: exceeded quota: no-pods'
    state, _ = s.step(s.PoolState(config=CONFIG), s.MembersObserved(s.MemberPods()), T0)
    state, _ = s.step(state, s.MembersObserved(s.MemberPods(not_created={"a": why})), T0 + 1)
    conditions = {c["type"]: c for c in ps.pool_status(state, None, T0 + 1)["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"],
            conditions["Ready"]["message"]) == ("False", "FailedCreate", why)
    assert (conditions["Reconciling"]["status"], conditions["Reconciling"]["reason"],
            conditions["Reconciling"]["message"]) == ("True", "FailedCreate", why)
    assert conditions["Stalled"]["status"] == "False"


def test_a_failing_container_shows_in_ready_and_reconciling_and_for_a_resident() -> None:
    crash = ("CrashLoopBackOff", "a is not starting: container model: CrashLoopBackOff")
    state, _ = s.step(s.PoolState(config=CONFIG), s.MembersObserved(s.MemberPods()), T0)
    failing = s.MemberPods(pods={"a": 1}, scheduled={"a": 1}, failing={"a": crash})
    state, _ = s.step(state, s.MembersObserved(failing), T0 + 1)
    conditions = {c["type"]: c for c in ps.pool_status(state, None, T0 + 1)["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"],
            conditions["Ready"]["message"]) == ("False", *crash)
    assert (conditions["Reconciling"]["reason"], conditions["Reconciling"]["message"]) == crash
    # A resident that crashes says why it has no Ready pod.
    resident = s.PoolState(config=CONFIG, generation=1, resident="a", resident_since=T0,
                           observed=failing)
    ready = {c["type"]: c for c in ps.pool_status(resident, None, T0)["conditions"]}["Ready"]
    assert (ready["reason"], ready["message"]) == (
        "ResidentNotReady", f"a has no Ready pod; {crash[1]}")


def test_a_target_the_scheduler_refuses_shows_in_ready_and_reconciling() -> None:
    why = "a cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    state, _ = s.step(s.PoolState(config=CONFIG), s.MembersObserved(s.MemberPods()), T0)
    refused = s.MemberPods(pods={"a": 1}, unschedulable={"a": why})
    state, _ = s.step(state, s.MembersObserved(refused), T0 + 1)
    conditions = {c["type"]: c for c in ps.pool_status(state, None, T0 + 1)["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False",
                                                                              "Unschedulable")
    assert conditions["Ready"]["message"] == why
    assert (conditions["Reconciling"]["status"], conditions["Reconciling"]["reason"],
            conditions["Reconciling"]["message"]) == ("True", "Unschedulable", why)
    assert conditions["Stalled"]["status"] == "False"

    placed = s.MemberPods(pods={"a": 1}, scheduled={"a": 1})
    state, _ = s.step(state, s.MembersObserved(placed), T0 + 2)
    conditions = {c["type"]: c for c in ps.pool_status(state, None, T0 + 2)["conditions"]}
    assert conditions["Reconciling"]["reason"] == "Swapping"


def test_a_pool_cold_for_idleness_says_why_is_ready_and_stays_cold_after_a_restart() -> None:
    config = replace(CONFIG, idle_unload_after=300.0)
    state = s.PoolState(
        config=config, generation=2, resident="b", resident_since=T0,
        observed=s.MemberPods(pods={"b": 1}, scheduled={"b": 1}, ready={"b": 1}))
    state, actions = s.step(state, s.Tick(), T0)
    assert actions == [s.ProbeActivity("b")]
    state, _ = s.step(state, s.ActivityResult("b", s.Verdict.IDLE, "0:3"), T0)
    for at in range(15, 301, 15):
        state, _ = s.step(state, s.Tick(), T0 + at)
        state, _ = s.step(state, s.ActivityResult("b", s.Verdict.IDLE, "0:3"), T0 + at)
    assert state.resident is None
    status = ps.pool_status(state, None, T0 + 300)
    assert status["phase"] == "Cold" and status["residentMember"] is None
    assert status["idleUnloaded"] == {
        "member": "b", "time": "2027-01-15T08:05:00Z", "idleSeconds": 300.0}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", s.IDLE_UNLOADED)
    assert "b served nothing for 300s" in ready["message"]
    # a new leader reads it back: Cold for idleness, so the default is not loaded
    restored = ps.restore(config, 2, status)
    assert restored.idle_unloaded == state.idle_unloaded
    restored, actions = s.step(restored, s.MembersObserved(s.MemberPods()), T0 + 400)
    assert actions == [] and restored.swap is None
    # and a request ends it: the field goes
    restored, _ = s.step(restored, s.RequestObserved(s.Request("b", 9)), T0 + 401)
    assert ps.pool_status(restored, status, T0 + 401)["idleUnloaded"] is None
