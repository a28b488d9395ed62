"""Saving and Restoring in both pool machines, case by case: a member that keeps its KV
cache is saved after its drain and before it is scaled to 0 (a swap, an eviction, an idle
unload), the unload goes on when the save answers or its cap passes, and a load restores
the saved slots once Ready, before the pool calls it resident."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from reconciler import kv_phases
from reconciler import residency as r
from reconciler import swap as s
from reconciler.kv_phases import (
    KV_RESTORE_ABANDONED,
    KV_SAVE_ABANDONED,
    Pending,
    RecordKvAbandoned,
    RestoreResult,
    RestoreSlots,
    SaveResult,
    SaveSlots,
)
from reconciler.swap import (
    Activity,
    ActivityResult,
    EmitEvent,
    IdleResult,
    MembersObserved,
    Outcome,
    Phase,
    PoolConfig,
    PoolState,
    RecordSwap,
    Request,
    RequestObserved,
    Scale,
    Tick,
    Verdict,
)
from tests.unit.test_residency import config as sized
from tests.unit.test_residency import kinds, pool
from tests.unit.test_residency import run as rrun
from tests.unit.test_swap import pods, run

pytestmark = pytest.mark.unit

CONFIG = PoolConfig(members=("a", "b"), default="a", swap_budget=100.0, probe_interval=2.0)


def warnings(actions: Sequence[r.Action]) -> list[str]:
    return [a.reason for a in kinds(actions, EmitEvent) if a.type == "Warning"]


def swapping(config: PoolConfig, idle_at: float = 1.0) -> tuple[PoolState, list[s.Action]]:
    """a resident, b requested at 0, a found idle at `idle_at`."""
    state = PoolState(config=config, resident="a", resident_since=0.0, observed=pods(a=1))
    return run(state, [(0.0, RequestObserved(Request("b", 1))),
                       (idle_at, IdleResult("a", Verdict.IDLE))])


# The helper


@pytest.mark.parametrize(("timeout", "now", "budget_end", "deadline"), [
    (10.0, 5.0, None, 15.0),     # the cap alone
    (10.0, 5.0, 100.0, 15.0),    # well within the budget
    (10.0, 95.0, 100.0, 100.0),  # what is left of the budget
])
def test_a_saves_deadline_is_its_cap_within_the_budget(
        timeout: float, now: float, budget_end: float | None, deadline: float) -> None:
    assert kv_phases.save_deadline(timeout, now, budget_end) == deadline


def test_only_members_with_a_cap_and_none_pending_are_started() -> None:
    pending = {"b": Pending("b", 0.0, 9.0)}
    out, actions = kv_phases.begin(pending, ["a", "b", "c"], {"a": 5.0, "b": 5.0}, 1.0, None)
    assert actions == [SaveSlots("a", 6.0)]
    assert set(out) == {"a", "b"} and out["b"] == pending["b"]
    _, restoring = kv_phases.begin({}, ["a"], {"a": 5.0}, 1.0, 2.0, restore=True)
    assert restoring == [RestoreSlots("a", 6.0)]  # a restore is not bounded by the budget


def test_an_answer_to_no_pending_one_is_none_and_late_ones_expire() -> None:
    pending = {"a": Pending("a", 0.0, 5.0), "b": Pending("b", 0.0, 9.0)}
    assert kv_phases.answer(pending, "c") is None
    assert kv_phases.answer(pending, "a") == {"b": pending["b"]}
    assert kv_phases.expire(pending, 5.0) == ({"b": pending["b"]}, ["a"])
    assert kv_phases.next_deadline(pending, {}) == 5.0


def test_late_saves_and_restores_are_abandoned_together_saves_first() -> None:
    saves = {"a": Pending("a", 0.0, 5.0), "b": Pending("b", 0.0, 9.0)}
    restores = {"c": Pending("c", 1.0, 4.0)}
    assert kv_phases.expire_both(saves, restores, 3.0) is None
    expired = kv_phases.expire_both(saves, restores, 5.0)
    assert expired is not None
    assert expired.saves == {"b": saves["b"]} and expired.restores == {}
    assert [(a.record, a.reason) for a in expired.abandoned] == [
        (RecordKvAbandoned("a", "save"), KV_SAVE_ABANDONED),
        (RecordKvAbandoned("c", "restore"), KV_RESTORE_ABANDONED)]
    assert expired.abandoned[1].message == (
        "restoring c's slots did not answer within 3s: the load goes on without them")
    assert expired.late_saves == ["a"]


# The exclusive pool


def test_a_persisted_incumbent_is_saved_before_it_is_scaled_to_zero() -> None:
    state, actions = swapping(replace(CONFIG, kv_caps={"a": 10.0}))
    assert state.swap is not None and state.swap.phase is Phase.SAVING
    assert kinds(actions, SaveSlots) == [SaveSlots("a", 11.0)]
    assert kinds(actions, Scale) == []  # a runs, b not staged yet
    assert s.desired_replicas(state) == {"a": 1, "b": 0}
    assert s.released(state) == {"a"} and state.resident == "a"
    assert s.next_wakeup(state) == 11.0

    state, actions = s.step(state, SaveResult("a"), 3.0)
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("b", 1)]
    assert state.swap.durations == (("drain", 1.0), ("save", 2.0))
    assert warnings(actions) == []


def test_a_member_that_keeps_nothing_is_unloaded_at_once() -> None:
    state, actions = swapping(replace(CONFIG, kv_caps={"b": 10.0}))
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    assert kinds(actions, SaveSlots) == []
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("b", 1)]


def test_a_save_past_its_cap_is_abandoned_told_counted_and_the_unload_goes_on() -> None:
    state, _ = swapping(replace(CONFIG, kv_caps={"a": 10.0}))
    state, actions = s.step(state, Tick(), 10.9)
    assert kinds(actions, Scale) == [] and state.swap is not None
    state, actions = s.step(state, Tick(), 11.0)
    assert kinds(actions, RecordKvAbandoned) == [RecordKvAbandoned("a", "save")]
    assert warnings(actions) == [KV_SAVE_ABANDONED]
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("b", 1)]
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    # the shell's answer after the cap is to a question no longer asked
    after, more = s.step(state, SaveResult("a"), 12.0)
    assert more == [] and after == state


def test_a_save_ends_with_the_swaps_budget() -> None:
    state, actions = swapping(replace(CONFIG, kv_caps={"a": 10.0}), idle_at=95.0)
    assert kinds(actions, SaveSlots) == [SaveSlots("a", 100.0)]
    state, actions = s.step(state, Tick(), 100.0)
    assert state.swap is None and state.resident == "a"  # abandoned as a drain is
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.ABANDONED
    assert Scale("a", 0) not in actions and Scale("b", 0) not in actions


def loaded(config: PoolConfig, ready_at: float = 20.0) -> tuple[PoolState, list[s.Action]]:
    state, _ = swapping(config)
    return run(state, [(2.0, MembersObserved(pods())),
                       (ready_at, MembersObserved(pods(b=1)))])


def test_a_persisted_target_with_saved_slots_restores_them_before_it_is_resident() -> None:
    config = replace(CONFIG, kv_caps={"b": 5.0}, kv_saved=frozenset({"b"}))
    state, actions = loaded(config)
    assert kinds(actions, RestoreSlots) == [RestoreSlots("b", 25.0)]
    assert state.swap is not None and state.swap.phase is Phase.RESTORING
    assert state.resident is None and s.phase_of(state) == "Swapping"
    assert s.released(state) == {"b"} and s.desired_replicas(state) == {"a": 0, "b": 1}

    state, actions = s.step(state, RestoreResult("b"), 21.0)
    assert state.resident == "b" and state.swap is None
    assert state.last_swap is not None
    assert [p for p, _ in state.last_swap.phases] == [
        "drain", "unload", "schedule", "load", "restore"]
    assert state.last_swap.phases[-1] == ("restore", 1.0)
    assert kinds(actions, RecordSwap)[0].phases == state.last_swap.phases


@pytest.mark.parametrize(("caps", "saved"), [
    ({"b": 5.0}, frozenset()),             # nothing saved
    ({}, frozenset({"b"})),                # saved, but persist is off now
])
def test_nothing_is_restored_without_both_persist_and_saved_slots(
        caps: dict[str, float], saved: frozenset[str]) -> None:
    state, actions = loaded(replace(CONFIG, kv_caps=caps, kv_saved=saved))
    assert kinds(actions, RestoreSlots) == [] and state.resident == "b"


def test_a_restore_is_bounded_by_its_cap_not_by_the_budget() -> None:
    config = replace(CONFIG, kv_caps={"b": 5.0}, kv_saved=frozenset({"b"}))
    state, _ = loaded(config, ready_at=99.0)
    state, actions = s.step(state, Tick(), 101.0)  # past swapBudget: the target is Ready
    assert state.swap is not None and state.swap.phase is Phase.RESTORING
    assert kinds(actions, Scale) == []
    state, actions = s.step(state, Tick(), 104.0)
    assert kinds(actions, RecordKvAbandoned) == [RecordKvAbandoned("b", "restore")]
    assert warnings(actions) == [KV_RESTORE_ABANDONED]
    assert state.resident == "b"
    assert state.last_swap is not None and state.last_swap.outcome is Outcome.SUCCEEDED


def idle_resident(config: PoolConfig) -> PoolState:
    return PoolState(config=config, resident="a", resident_since=0.0, observed=pods(a=1),
                     activity=Activity("a", "m", active_at=0.0, next_probe=0.0,
                                       probe_in_flight=True))


def test_an_idle_unload_saves_first_and_scales_to_zero_when_saved() -> None:
    config = replace(CONFIG, idle_unload_after=60.0, kv_caps={"a": 10.0})
    state, actions = s.step(idle_resident(config), ActivityResult("a", Verdict.IDLE, "m"), 100.0)
    assert kinds(actions, SaveSlots) == [SaveSlots("a", 110.0)]
    assert kinds(actions, Scale) == []
    assert state.resident is None and s.phase_of(state) == "Cold"
    assert s.desired_replicas(state) == {"a": 1, "b": 0}
    state, actions = s.step(state, SaveResult("a"), 101.0)
    assert kinds(actions, Scale) == [Scale("a", 0)]
    assert s.desired_replicas(state) == {"a": 0, "b": 0}


def test_a_swap_while_a_member_is_saved_waits_for_its_pods() -> None:
    config = replace(CONFIG, idle_unload_after=60.0, kv_caps={"a": 10.0})
    state, _ = s.step(idle_resident(config), ActivityResult("a", Verdict.IDLE, "m"), 100.0)
    state, actions = s.step(state, RequestObserved(Request("b", 1)), 101.0)
    assert Scale("a", 0) not in actions  # its save goes on
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING
    state, actions = s.step(state, SaveResult("a"), 102.0)
    assert Scale("a", 0) in actions
    assert state.swap is not None and state.swap.phase is Phase.UNLOADING


# The budgeted pool


def budget(**changes: Any) -> r.ResidencyConfig:
    """a, b and d: 20, 20 and 24 GiB on a 48 GiB budget."""
    return sized(members=("a", "b", "d"), **changes)


def residents(config: r.ResidencyConfig, *members: str) -> r.ResidencyState:
    """`members` resident, the first least recently used."""
    return pool({m: float(i) for i, m in enumerate(members)}, config)


def test_a_persisted_victim_is_saved_before_it_is_evicted() -> None:
    state, actions = rrun(residents(budget(kv_caps={"a": 10.0}), "a", "b"),
                          [(10.0, RequestObserved(Request("d", 1))),
                           (11.0, IdleResult("a", Verdict.IDLE))])
    assert kinds(actions, SaveSlots) == [SaveSlots("a", 21.0)]
    assert kinds(actions, Scale) == [] and kinds(actions, r.RecordEviction) != []
    (load,) = state.loads
    assert load.phase is Phase.SAVING and load.victims == ("a",)
    assert "a" not in state.residents
    assert r.desired_replicas(state) == {"a": 1, "b": 1, "d": 0}

    state, actions = r.step(state, SaveResult("a"), 12.0)
    assert kinds(actions, Scale) == [Scale("a", 0), Scale("d", 1)]
    (load,) = state.loads
    assert load.phase is Phase.UNLOADING
    assert load.durations == (("drain", 1.0), ("save", 1.0))


def test_a_victims_save_past_its_cap_is_abandoned_and_it_is_evicted() -> None:
    state, _ = rrun(residents(budget(kv_caps={"a": 10.0}), "a", "b"),
                    [(10.0, RequestObserved(Request("d", 1))),
                     (11.0, IdleResult("a", Verdict.IDLE))])
    state, actions = r.step(state, Tick(), 21.0)
    assert kinds(actions, RecordKvAbandoned) == [RecordKvAbandoned("a", "save")]
    assert warnings(actions) == [KV_SAVE_ABANDONED]
    assert Scale("a", 0) in actions
    assert state.loads[0].phase is Phase.UNLOADING


def test_a_budgeted_load_restores_before_it_is_resident() -> None:
    config = budget(kv_caps={"d": 5.0}, kv_saved=frozenset({"d"}))
    state, _ = rrun(residents(config, "a"), [(1.0, RequestObserved(Request("d", 1)))])
    assert state.loads and state.loads[0].phase is Phase.LOADING
    state, actions = r.step(state, MembersObserved(pods(a=1, d=1)), 5.0)
    assert kinds(actions, RestoreSlots) == [RestoreSlots("d", 10.0)]
    assert "d" not in state.residents and "d" in r.released(state)
    assert r.phase_of(state) == "Swapping"
    state, actions = r.step(state, RestoreResult("d"), 6.0)
    assert "d" in state.residents and not state.loads
    (recorded,) = kinds(actions, r.RecordLoad)
    assert recorded.phases[-1] == ("restore", 1.0)
    assert state.last_load is not None and state.last_load.phases == recorded.phases


def test_a_budgeted_idle_unload_saves_first() -> None:
    config = budget(idle_unload_after=60.0, kv_caps={"a": 10.0})
    state = residents(config, "a")
    state = replace(state, activity={"a": Activity("a", "m", active_at=0.0, next_probe=0.0,
                                                   probe_in_flight=True)})
    state, actions = r.step(state, ActivityResult("a", Verdict.IDLE, "m"), 100.0)
    assert kinds(actions, SaveSlots) == [SaveSlots("a", 110.0)]
    assert kinds(actions, Scale) == [] and "a" not in state.residents
    assert r.desired_replicas(state) == {"a": 1, "b": 0, "d": 0}
    state, actions = r.step(state, SaveResult("a"), 101.0)
    assert kinds(actions, Scale) == [Scale("a", 0)]


def test_a_budgeted_restore_is_bounded_by_its_cap_not_by_the_budget() -> None:
    config = budget(kv_caps={"d": 5.0}, kv_saved=frozenset({"d"}))
    state, _ = rrun(residents(config, "a"), [(1.0, RequestObserved(Request("d", 1)))])
    state, _ = r.step(state, MembersObserved(pods(a=1, d=1)), 99.0)
    state, actions = r.step(state, Tick(), 102.0)  # past swapBudget: the target is Ready
    assert state.loads and state.loads[0].phase is Phase.RESTORING
    assert kinds(actions, Scale) == []
    state, actions = r.step(state, Tick(), 104.0)
    assert warnings(actions) == [KV_RESTORE_ABANDONED] and "d" in state.residents


def test_a_reclaim_saves_the_member_it_hands_the_slot_back_from() -> None:
    config = replace(CONFIG, policy="reclaim", reclaim_after=10.0, kv_caps={"b": 5.0})
    state = PoolState(config=config, resident="b", resident_since=0.0, observed=pods(b=1))
    state, actions = run(state, [(10.0, Tick()), (11.0, IdleResult("b", Verdict.IDLE))])
    assert state.swap is not None and state.swap.reclaim
    assert state.swap.phase is Phase.SAVING and state.swap.to == "a"
    assert kinds(actions, SaveSlots) == [SaveSlots("b", 16.0)]
    assert s.visible_swap(state) is not None  # found idle: a swap from here on
