"""The budgeted pool's state machine, case by case: which member is loaded at once, which
residents are evicted for it, and when."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from reconciler import residency as r
from reconciler.residency import (
    Activity,
    ActivityResult,
    ClearRequest,
    EmitEvent,
    IdleResult,
    MemberPods,
    MembersObserved,
    Outcome,
    Phase,
    ProbeActivity,
    ProbeIdle,
    RecordEviction,
    RecordFailure,
    RecordLoad,
    Request,
    RequestObserved,
    ResidencyConfig,
    ResidencyState,
    Resident,
    Scale,
    SpecObserved,
    Tick,
    Verdict,
)

pytestmark = pytest.mark.unit

A = TypeVar("A")
GIB = 1 << 30
SIZES = {"a": 20, "b": 20, "c": 8, "d": 24, "e": 40, "f": 12}


def config(**changes: Any) -> ResidencyConfig:
    """Six members on a 48 GiB budget (a 20, b 20, c 8, d 24, e 40, f 12 GiB)."""
    base = ResidencyConfig(
        members=tuple(SIZES), gpu_memory=48 * GIB,
        footprints={m: n * GIB for m, n in SIZES.items()},
        swap_budget=100.0, probe_interval=2.0,
    )
    return replace(base, **changes)


def ready(*members: str) -> MemberPods:
    return MemberPods(pods=dict.fromkeys(members, 1), scheduled=dict.fromkeys(members, 1),
                      ready=dict.fromkeys(members, 1))


def pool(used: Mapping[str, float], cfg: ResidencyConfig | None = None,
         since: Mapping[str, float] | None = None, watched: bool = True) -> ResidencyState:
    """Residents (each Ready) by when they were last used; `watched`: their activity
    probed a moment ago (no activity probe comes up in the case)."""
    since = since or {}
    return ResidencyState(
        config=cfg or config(),
        residents={m: Resident(m, since.get(m, 0.0), t) for m, t in used.items()},
        observed=ready(*used),
        activity={m: Activity(m, "0", active_at=0.0, next_probe=1e9) for m in used}
        if watched else {},
    )


def run(state: ResidencyState, events: Sequence[tuple[float, r.Event]]
        ) -> tuple[ResidencyState, list[r.Action]]:
    actions: list[r.Action] = []
    for now, event in events:
        state, more = r.step(state, event, now)
        actions += more
    return state, actions


def ask(member: str | None, generation: int = 1) -> RequestObserved:
    return RequestObserved(Request(member, generation))


def kinds(actions: Sequence[r.Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def reasons(actions: Sequence[r.Action]) -> list[str]:
    return [a.reason for a in kinds(actions, EmitEvent)]


def scales(actions: Sequence[r.Action]) -> dict[str, int]:
    return {a.member: a.replicas for a in kinds(actions, Scale)}


# Loading what fits


@pytest.mark.parametrize(
    ("residents", "target"),
    [
        ({}, "e"),                       # an empty pool: anything within the budget
        ({"a": 1.0}, "b"),               # 20 + 20 of 48
        ({"a": 1.0, "c": 2.0}, "f"),     # 20 + 8 + 12 of 48
        ({"a": 1.0, "c": 2.0}, "b"),     # 20 + 8 + 20: exactly the budget
    ],
)
def test_a_member_that_fits_is_loaded_at_once_and_nobody_drained(
        residents: dict[str, float], target: str) -> None:
    state, actions = run(pool(residents), [(10.0, ask(target))])
    assert scales(actions) == {target: 1}
    assert kinds(actions, ProbeIdle) == []
    assert target in r.released(state)
    assert r.desired_replicas(state) == {m: int(m in residents or m == target) for m in SIZES}
    observed = ready(*residents, target)
    state, actions = run(state, [(12.0, MembersObserved(observed))])
    assert set(state.residents) == {*residents, target}
    assert state.residents[target] == Resident(target, 12.0, 12.0)
    assert kinds(actions, RecordLoad) == [RecordLoad(target, (), 2.0, (
        ("unload", 0.0), ("schedule", 2.0), ("load", 0.0)))]
    assert state.answered == 1 and state.loads == ()
    assert r.room_left(state) == 48 * GIB - sum(SIZES[m] * GIB for m in state.residents)


def test_a_request_for_a_resident_is_answered_at_once_and_marks_it_used() -> None:
    state, actions = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("a", 4))])
    assert scales(actions) == {} and state.loads == ()
    assert state.answered == 4
    assert state.residents["a"].last_used == 10.0
    assert r.lru(state) == ("b", "a")


# Making room


@pytest.mark.parametrize(
    ("residents", "target", "victims"),
    [
        # least recently used first
        ({"a": 5.0, "b": 9.0}, "d", ("a",)),
        ({"a": 9.0, "b": 5.0}, "d", ("b",)),
        # the fewest: c (8) cannot make room for f (12) alone, a can: the oldest that can
        ({"c": 1.0, "a": 5.0, "b": 9.0}, "f", ("a",)),
        # e needs 32: c and f, the two oldest, free 20; f and b are the oldest pair that do
        ({"c": 1.0, "f": 2.0, "b": 3.0}, "e", ("f", "b")),
        # e needs 40: only a and b together; c is passed over
        ({"c": 1.0, "a": 5.0, "b": 9.0}, "e", ("a", "b")),
        # everything goes when only everything makes room
        ({"a": 5.0, "b": 9.0}, "e", ("a", "b")),
    ],
)
def test_victims_are_the_fewest_least_recently_used_that_make_room(
        residents: dict[str, float], target: str, victims: tuple[str, ...]) -> None:
    state, actions = run(pool(residents), [(10.0, ask(target))])
    assert r.evicting(state) == (target, victims)
    assert sorted(kinds(actions, ProbeIdle), key=lambda p: p.member) == [
        ProbeIdle(m) for m in sorted(victims)]
    assert scales(actions) == {}
    events: list[tuple[float, r.Event]] = [(10.5, IdleResult(m, Verdict.IDLE)) for m in victims]
    state, actions = run(state, events)
    assert scales(actions) == {**dict.fromkeys(victims, 0), target: 1}
    assert kinds(actions, RecordEviction) == [RecordEviction(v, target) for v in victims]
    assert reasons(actions).count(r.EVICTED) == len(victims)
    assert set(state.residents) == set(residents) - set(victims)
    assert target not in r.released(state)  # its victims' pods are not gone yet
    stay = [m for m in residents if m not in victims]
    gated = MemberPods(pods={**dict.fromkeys(residents, 1), target: 1},
                       scheduled=dict.fromkeys(residents, 1), ready=dict.fromkeys(residents, 1),
                       terminating=dict.fromkeys(victims, 1))
    state, _ = run(state, [(11.0, MembersObserved(gated))])
    assert target not in r.released(state)
    gone = MemberPods(pods={**dict.fromkeys(stay, 1), target: 1},
                      scheduled=dict.fromkeys(stay, 1), ready=dict.fromkeys(stay, 1))
    state, _ = run(state, [(13.0, MembersObserved(gone))])
    assert target in r.released(state)
    state, actions = run(state, [(16.0, MembersObserved(ready(*stay, target)))])
    assert set(state.residents) == {*stay, target}
    [done] = kinds(actions, RecordLoad)
    assert done.evicted == victims and done.duration == 6.0
    assert [p for p, _ in done.phases] == ["drain", "unload", "schedule", "load"]
    assert state.last_load is not None and state.last_load.evicted == victims


def test_an_eviction_waits_for_every_victim_to_be_idle_and_no_probe_out() -> None:
    state, _ = run(pool({"c": 1.0, "f": 2.0, "b": 3.0}), [(10.0, ask("e"))])
    assert r.evicting(state) == ("e", ("f", "b"))
    state, actions = run(state, [(10.5, IdleResult("f", Verdict.IDLE))])
    assert scales(actions) == {}  # b has not answered
    state, actions = run(state, [(11.0, IdleResult("b", Verdict.IDLE))])
    assert scales(actions) == {"f": 0, "b": 0, "e": 1}


def test_an_activity_probe_out_holds_an_eviction_until_it_answers() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}, watched=False), [(9.0, Tick())])
    state, actions = run(state, [(10.0, ask("d")), (10.5, IdleResult("a", Verdict.IDLE))])
    assert scales(actions) == {}
    state, actions = run(state, [(10.6, ActivityResult("a", Verdict.IDLE, "0"))])
    assert scales(actions) == {"a": 0, "d": 1}


def test_an_idle_answer_goes_stale_after_a_probe_interval() -> None:
    state, _ = run(pool({"c": 1.0, "f": 2.0, "b": 3.0}), [(10.0, ask("e"))])
    state, _ = run(state, [(10.5, IdleResult("f", Verdict.IDLE))])
    assert r.next_wakeup(state) == 12.5
    state, actions = run(state, [(12.5, Tick())])
    assert kinds(actions, ProbeIdle) == [ProbeIdle("f")]  # asked again; b's is still out
    state, actions = run(state, [(13.0, IdleResult("b", Verdict.IDLE))])
    assert scales(actions) == {} and kinds(actions, ProbeIdle) == []
    state, actions = run(state, [(13.5, IdleResult("f", Verdict.IDLE))])
    assert scales(actions) == {"f": 0, "b": 0, "e": 1}


def test_a_victim_without_pods_needs_no_probe() -> None:
    state = pool({"a": 1.0, "b": 2.0})
    state = replace(state, observed=ready("b"))  # a's pod was deleted under it
    state, actions = run(state, [(10.0, ask("d"))])
    assert kinds(actions, ProbeIdle) == []
    assert scales(actions) == {"a": 0, "d": 1}


# minResidency and priority


@pytest.mark.parametrize(
    ("priorities", "now", "victims"),
    [
        ({}, 10.0, None),                          # both inside minResidency: wait
        ({}, 31.0, ("a",)),                        # a served it (resident since 0)
        ({"d": 1}, 10.0, ("a",)),                  # d outranks both
        ({"d": 1, "a": 2}, 10.0, ("b",)),          # d outranks b only, though a is older
    ],
)
def test_min_residency_protects_a_resident_unless_the_target_outranks_it(
        priorities: dict[str, int], now: float, victims: tuple[str, ...] | None) -> None:
    cfg = config(min_residency=30.0, priorities=priorities)
    state = pool({"a": 1.0, "b": 2.0}, cfg, since={"a": 0.0, "b": 5.0})
    state, actions = run(state, [(now, ask("d"))])
    if victims is None:
        assert r.evicting(state) is None and kinds(actions, ProbeIdle) == []
        assert state.loads[0].deferral is not None
        assert state.loads[0].deferral.reason == r.MIN_RESIDENCY
        assert r.next_wakeup(state) == 30.0  # a's residency ends first
        state, actions = run(state, [(30.0, Tick())])
        assert kinds(actions, ProbeIdle) == [ProbeIdle("a")]
    else:
        assert r.evicting(state) == ("d", victims)


# Busy victims


def test_a_busy_victim_defers_the_load_when_no_other_would_do() -> None:
    state, _ = run(pool({"a": 1.0, "c": 2.0}), [(10.0, ask("e"))])
    assert r.evicting(state) == ("e", ("a",))
    state, actions = run(state, [(10.5, IdleResult("a", Verdict.BUSY))])
    assert scales(actions) == {}
    assert reasons(actions) == ["SwapDeferred"]
    assert state.loads[0].deferral is not None
    assert state.loads[0].deferral.reason == r.PODS_BUSY
    assert r.next_wakeup(state) == 12.5
    state, actions = run(state, [(12.5, Tick())])
    assert kinds(actions, ProbeIdle) == [ProbeIdle("a")]
    state, actions = run(state, [(13.0, IdleResult("a", Verdict.FAILED))])
    assert scales(actions) == {} and "SwapDeferred" in reasons(actions)
    assert state.loads[0].deferral is not None
    assert state.loads[0].deferral.reason == r.IDLE_CHECK_FAILED
    state, actions = run(state, [(15.0, Tick()), (15.5, IdleResult("a", Verdict.IDLE))])
    assert scales(actions) == {"a": 0, "e": 1}


def test_another_idle_resident_that_would_do_is_preferred_over_a_busy_one() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0, "c": 3.0}), [(10.0, ask("f"))])
    assert r.evicting(state) == ("f", ("a",))
    state, actions = run(state, [(10.5, IdleResult("a", Verdict.BUSY))])
    assert r.evicting(state) == ("f", ("b",))
    assert kinds(actions, ProbeIdle) == [ProbeIdle("b")]
    state, actions = run(state, [(11.0, IdleResult("b", Verdict.IDLE))])
    assert scales(actions) == {"b": 0, "f": 1}
    assert "a" in state.residents


def test_idle_residents_are_preferred_even_where_that_takes_more_of_them() -> None:
    state, _ = run(pool({"a": 1.0, "c": 2.0, "f": 3.0}), [(10.0, ask("d"))])
    assert r.evicting(state) == ("d", ("a",))
    state, _ = run(state, [(10.5, IdleResult("a", Verdict.BUSY))])
    assert r.evicting(state) == ("d", ("c", "f"))


def test_an_activity_probe_that_finds_a_victim_busy_counts_for_the_drain() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0, "c": 3.0}, watched=False), [(10.0, ask("f"))])
    assert state.activity["a"].probe_in_flight
    state, _ = run(state, [(10.2, ActivityResult("a", Verdict.BUSY, mark="7"))])
    assert state.residents["a"].last_used == 10.2
    assert r.evicting(state) == ("f", ("b",))


def test_a_victim_that_can_never_be_probed_fails_the_load_if_only_it_makes_room() -> None:
    state, _ = run(pool({"a": 1.0, "c": 2.0}), [(10.0, ask("e"))])
    state, actions = run(state, [(10.5, IdleResult("a", Verdict.UNSUPPORTED))])
    assert reasons(actions) == ["SwapFailed"]
    assert kinds(actions, ClearRequest) == [ClearRequest(1)]
    assert state.last_load is not None
    assert state.last_load.reason == r.IDLE_PROBE_UNSUPPORTED
    assert scales(actions) == {} and state.loads == ()


def test_a_victim_that_can_never_be_probed_is_passed_over_where_another_would_do() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("d"))])
    state, _ = run(state, [(10.5, IdleResult("a", Verdict.UNSUPPORTED))])
    assert r.evicting(state) == ("d", ("b",))


# The budget counts terminating pods


def test_terminating_pods_count_against_the_budget() -> None:
    # b was unloaded a moment ago and its pod is still terminating: c fits beside a
    # once it has gone, so nobody is drained, but c waits for it
    observed = MemberPods(pods={"a": 1, "b": 1}, scheduled={"a": 1, "b": 1},
                          ready={"a": 1}, terminating={"b": 1})
    state = replace(pool({"a": 1.0}), observed=observed)
    state, actions = run(state, [(10.0, ask("d"))])
    assert kinds(actions, ProbeIdle) == [] and r.evicting(state) is None
    assert scales(actions) == {"d": 1}  # staged: created gated
    assert "d" not in r.released(state)
    assert r.room_left(state) == (48 - 20 - 20 - 24) * GIB
    state, _ = run(state, [(12.0, MembersObserved(MemberPods(
        pods={"a": 1, "d": 1}, scheduled={"a": 1}, ready={"a": 1})))])
    assert "d" in r.released(state)


def test_a_member_is_not_scaled_up_while_its_own_old_pod_terminates() -> None:
    observed = MemberPods(pods={"a": 1, "d": 1}, scheduled={"a": 1, "d": 1},
                          ready={"a": 1}, terminating={"d": 1})
    state = replace(pool({"a": 1.0}), observed=observed)
    state, actions = run(state, [(10.0, ask("d"))])
    assert scales(actions) == {}
    assert r.desired_replicas(state) == {**dict.fromkeys(SIZES, 0), "a": 1}
    state, actions = run(state, [(12.0, MembersObserved(ready("a")))])
    assert scales(actions) == {"d": 1}
    assert "d" in r.released(state)


def test_a_replacement_pod_of_a_resident_waits_for_the_one_it_replaces() -> None:
    observed = MemberPods(pods={"a": 2}, scheduled={"a": 1}, ready={}, terminating={"a": 1})
    state, _ = run(replace(pool({"a": 1.0}), observed=observed), [(10.0, Tick())])
    assert r.released(state) == frozenset()
    state, _ = run(state, [(11.0, MembersObserved(MemberPods(pods={"a": 1})))])
    assert r.released(state) == {"a"}


def test_a_load_waits_for_room_that_loads_under_way_hold() -> None:
    state, _ = run(pool({}, watched=False), [(10.0, ask("e"))])  # e (40) loading
    state, actions = run(state, [(11.0, ask("a", 2))])
    [load] = [x for x in state.loads if x.to == "a"]
    assert load.phase is Phase.DRAINING and load.deferral is not None
    assert load.deferral.reason == r.WAITING_FOR_ROOM
    assert scales(actions) == {}
    state, actions = run(state, [(14.0, MembersObserved(ready("e")))])
    assert "e" in state.residents
    assert kinds(actions, ProbeIdle) == [ProbeIdle("e")]  # now a resident: a victim


# swapBudget


def test_a_load_past_swap_budget_is_abandoned_and_its_target_scaled_back() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("d", 3))])
    state, _ = run(state, [(10.5, IdleResult("a", Verdict.IDLE))])
    state, _ = run(state, [(12.0, MembersObserved(MemberPods(
        pods={"b": 1, "d": 1}, scheduled={"b": 1, "d": 1}, ready={"b": 1})))])
    assert state.loads[0].phase is Phase.LOADING
    assert r.next_wakeup(state) == 110.0
    state, actions = run(state, [(110.0, Tick())])
    assert scales(actions) == {"d": 0}
    assert kinds(actions, ClearRequest) == [ClearRequest(3)]
    assert kinds(actions, RecordFailure) == [RecordFailure("d", r.SWAP_BUDGET_EXCEEDED)]
    assert "SwapAbandoned" in reasons(actions)
    assert state.last_load is not None
    assert state.last_load.outcome is Outcome.ABANDONED and state.last_load.evicted == ("a",)
    assert state.loads == () and state.answered == 3
    assert set(state.residents) == {"b"}  # a stays unloaded


def test_a_load_that_never_drains_is_abandoned_with_nothing_scaled() -> None:
    state, _ = run(pool({"a": 1.0, "c": 2.0}), [(10.0, ask("e"))])
    state, _ = run(state, [(10.5, IdleResult("a", Verdict.BUSY))])
    state, actions = run(state, [(110.0, Tick())])
    assert scales(actions) == {}
    assert state.last_load is not None and state.last_load.outcome is Outcome.ABANDONED
    assert state.last_load.message is not None and "PodsBusy" in state.last_load.message
    assert set(state.residents) == {"a", "c"}


# Requests the pool refuses


@pytest.mark.parametrize(
    ("member", "reason"),
    [("huge", r.OVER_BUDGET), ("stranger", r.NOT_A_MEMBER)],
)
def test_a_request_the_pool_cannot_serve_is_rejected(member: str, reason: str) -> None:
    cfg = config(members=(*SIZES, "huge"),
                 footprints={**{m: n * GIB for m, n in SIZES.items()}, "huge": 49 * GIB})
    state, actions = run(pool({"a": 1.0}, cfg), [(10.0, ask(member, 5))])
    assert scales(actions) == {} and kinds(actions, ProbeIdle) == []
    assert kinds(actions, ClearRequest) == [ClearRequest(5)]
    assert reasons(actions) == [reason]
    assert kinds(actions, RecordFailure) == [RecordFailure(member, reason)]
    assert state.answered == 5 and state.last_load is not None
    assert state.last_load.outcome is Outcome.FAILED and state.last_load.reason == reason
    state, actions = run(state, [(11.0, Tick())])
    assert reasons(actions) == []  # answered once


# Newer requests


def test_a_newer_request_replaces_a_load_still_draining() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("d"))])
    state, _ = run(state, [(11.0, ask("e", 2))])
    assert [x.to for x in state.loads] == ["e"]
    assert r.evicting(state) == ("e", ("a", "b"))


def test_a_newer_request_that_fits_replaces_a_load_still_draining() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("d"))])
    state, actions = run(state, [(11.0, ask("c", 2))])
    assert scales(actions) == {"c": 1}
    assert [x.to for x in state.loads] == ["c"]


@pytest.mark.parametrize("member", [None, "b"])
def test_a_newer_request_for_nobody_or_a_resident_withdraws_a_draining_load(
        member: str | None) -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("d"))])
    state, actions = run(state, [(11.0, ask(member, 2))])
    assert reasons(actions) == ["SwapWithdrawn"]
    assert state.loads == () and state.answered == 2
    assert state.last_load is not None and state.last_load.outcome is Outcome.WITHDRAWN


def test_a_load_past_its_drain_is_not_withdrawn() -> None:
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(10.0, ask("d"))])
    state, _ = run(state, [(10.5, IdleResult("a", Verdict.IDLE))])
    state, actions = run(state, [(11.0, ask(None, 2))])
    assert reasons(actions) == [] and [x.to for x in state.loads] == ["d"]


def test_a_newer_request_for_the_member_loading_is_served_by_that_load() -> None:
    state, _ = run(pool({"a": 1.0}), [(10.0, ask("c"))])
    state, actions = run(state, [(11.0, ask("c", 2))])
    assert scales(actions) == {}
    assert state.loads[0].generation == 2
    state, _ = run(state, [(12.0, MembersObserved(ready("a", "c")))])
    assert state.answered == 2


# The default, reclaim and idleUnloadAfter


def test_a_cold_pool_loads_its_default() -> None:
    state, actions = run(pool({}, config(default="d")), [(0.0, Tick())])
    assert scales(actions) == {"d": 1} and "d" in r.released(state)
    assert reasons(actions) == ["SwapStarted"]


def test_under_sticky_the_default_is_not_loaded_beside_a_resident() -> None:
    state, actions = run(pool({"a": 1.0}, config(default="d")), [(0.0, Tick())])
    assert scales(actions) == {} and state.loads == ()


def test_under_reclaim_the_default_is_loaded_whenever_it_fits() -> None:
    cfg = config(default="d", policy="reclaim", reclaim_after=60.0)
    _, actions = run(pool({"a": 1.0}, cfg), [(5.0, Tick())])
    assert scales(actions) == {"d": 1}


def test_under_reclaim_members_unused_for_reclaim_after_make_room_for_the_default() -> None:
    cfg = config(default="d", policy="reclaim", reclaim_after=60.0)
    state = pool({"a": 1.0, "b": 30.0}, cfg)
    assert r.next_wakeup(state) is not None
    state, actions = run(state, [(50.0, Tick())])
    assert kinds(actions, ProbeIdle) == [] and state.loads == ()
    assert r._reclaim_due_at(state) == 61.0
    state, actions = run(state, [(61.0, Tick())])
    assert kinds(actions, ProbeIdle) == [ProbeIdle("a")]
    assert r.visible_loads(state) == () and r.evicting(state) is None  # not a load yet
    state, actions = run(state, [(61.5, IdleResult("a", Verdict.IDLE))])
    assert scales(actions) == {"a": 0, "d": 1}
    assert reasons(actions)[0] == "SwapStarted"


def test_under_reclaim_a_busy_answer_calls_the_reclaim_off() -> None:
    cfg = config(default="d", policy="reclaim", reclaim_after=60.0)
    state, _ = run(pool({"a": 1.0, "b": 30.0}, cfg), [(61.0, Tick())])
    state, actions = run(state, [(61.5, IdleResult("a", Verdict.BUSY))])
    assert state.loads == () and scales(actions) == {}
    assert state.reclaim_at == 121.5
    assert r._reclaim_due_at(state) == 121.5


def test_under_reclaim_a_request_calls_the_reclaim_off() -> None:
    cfg = config(default="d", policy="reclaim", reclaim_after=60.0)
    state, _ = run(pool({"a": 1.0, "b": 30.0}, cfg), [(61.0, Tick())])
    state, actions = run(state, [(61.2, ask("c"))])
    assert [x.to for x in state.loads] == ["c"]
    assert reasons(actions) == ["SwapStarted"]


def _idle_unload_pool() -> ResidencyState:
    cfg = config(idle_unload_after=40.0, default="a")
    state, actions = run(pool({"a": 0.0, "b": 0.0}, cfg, watched=False), [(0.0, Tick())])
    assert sorted(kinds(actions, ProbeActivity), key=lambda p: p.member) == [
        ProbeActivity("a"), ProbeActivity("b")]
    return state


def test_idle_unload_after_unloads_each_resident_on_its_own() -> None:
    state = _idle_unload_pool()
    state, _ = run(state, [(0.5, ActivityResult("a", Verdict.IDLE, "1")),
                           (0.5, ActivityResult("b", Verdict.IDLE, "1"))])
    for t in (10.5, 20.5, 30.5):
        state, _ = run(state, [(t, Tick()), (t, ActivityResult("a", Verdict.IDLE, "1")),
                               (t, ActivityResult("b", Verdict.IDLE, str(int(t))))])
    assert state.residents["b"].last_used == 30.5
    state, actions = run(state, [(40.5, Tick()), (40.5, ActivityResult("a", Verdict.IDLE, "1"))])
    assert scales(actions) == {"a": 0}
    assert reasons(actions) == [r.IDLE_UNLOADED]
    assert set(state.residents) == {"b"} and set(state.idle_unloads) == {"a"}
    # the default (a) is not loaded back though it fits, nor when b goes too
    state, actions = run(state, [(41.0, Tick())])
    assert scales(actions) == {}
    state, _ = run(state, [(41.0, MembersObserved(ready("b")))])
    state, actions = run(state, [(t, e) for t in (50.5, 60.5, 70.5, 80.5)
                                 for e in (Tick(), ActivityResult("b", Verdict.IDLE, "30"))])
    assert scales(actions) == {"b": 0} and state.residents == {}
    state, actions = run(state, [(81.0, MembersObserved(MemberPods())), (81.0, Tick())])
    assert scales(actions) == {} and r.phase_of(state) == "Cold"


def test_a_failed_activity_probe_keeps_the_member() -> None:
    state = _idle_unload_pool()
    state, _ = run(state, [(0.5, ActivityResult("a", Verdict.IDLE, "1"))])
    for t in (10.5, 20.5, 30.5, 40.5):
        state, actions = run(state, [(t, Tick()), (t, ActivityResult("a", Verdict.FAILED))])
        assert scales(actions) == {}
    assert "a" in state.residents
    assert state.residents["a"].last_used == 0.0  # a failure is not a use


def test_activity_is_watched_only_where_it_matters() -> None:
    everything_fits = config(members=("a", "c"), footprints={"a": 20 * GIB, "c": 8 * GIB})
    state, actions = run(pool({"a": 0.0, "c": 0.0}, everything_fits, watched=False),
                         [(0.0, Tick())])
    assert kinds(actions, ProbeActivity) == [] and r.next_wakeup(state) is None
    state, actions = run(pool({"a": 0.0}, watched=False), [(0.0, Tick())])
    assert kinds(actions, ProbeActivity) == [ProbeActivity("a")]
    state, _ = run(state, [(0.5, ActivityResult("a", Verdict.IDLE, "1"))])
    assert r.next_wakeup(state) == 15.5


# The spec


def test_a_member_without_a_footprint_stalls_the_pool() -> None:
    cfg = config(footprints={"a": 20 * GIB})
    state, actions = run(pool({}), [(0.0, SpecObserved(cfg, 2)), (1.0, ask("a"))])
    assert state.problem is not None and state.problem.reason == r.INVALID_BUDGET
    assert reasons(actions) == [r.INVALID_BUDGET]
    assert scales(actions) == {} and r.desired_replicas(state) is None
    assert r.released(state) == frozenset() and r.phase_of(state) == "Degraded"
    state, actions = run(state, [(2.0, SpecObserved(config(), 3))])
    assert "SpecValid" in reasons(actions) and scales(actions) == {"a": 1}


def test_a_member_removed_from_the_spec_is_no_longer_resident() -> None:
    cfg = config(members=("b", "c"), footprints={"b": 20 * GIB, "c": 8 * GIB})
    state, _ = run(pool({"a": 1.0, "b": 2.0}), [(5.0, SpecObserved(cfg, 2))])
    assert set(state.residents) == {"b"}
    assert r.desired_replicas(state) == {"b": 1, "c": 0}


# Status views


def test_status_lists_the_residents_and_the_room_left() -> None:
    state = ResidencyState(
        config=config(),
        residents={"a": Resident("a", 4.0, 9.0), "c": Resident("c", 2.0, 3.0)},
        observed=ready("a", "c"),
    )
    assert r.residents_of(state) == (
        r.ResidentView("c", 2.0, 8 * GIB, 3.0), r.ResidentView("a", 4.0, 20 * GIB, 9.0))
    assert r.used(state) == 28 * GIB and r.room_left(state) == 20 * GIB
    assert r.lru(state) == ("c", "a")
    assert r.phase_of(state) == "Ready"
    state, _ = run(state, [(10.0, ask("e"))])
    assert r.phase_of(state) == "Swapping"
    assert r.room_left(state) == 20 * GIB  # nothing promised to e before its drain


@pytest.mark.parametrize(
    ("candidates", "need", "chosen"),
    [
        ([("a", 8), ("b", 20), ("c", 20)], 20, ("b",)),
        ([("a", 8), ("b", 20), ("c", 20)], 21, ("a", "b")),
        ([("a", 8), ("b", 8), ("c", 20), ("d", 20)], 36, ("c", "d")),
        ([("a", 8), ("b", 8), ("c", 20), ("d", 20)], 41, ("a", "c", "d")),
        ([("a", 8), ("b", 8)], 17, None),
        ([("a", 8)], 0, ()),
    ],
)
def test_fewest(candidates: list[tuple[str, int]], need: int,
                chosen: tuple[str, ...] | None) -> None:
    assert r._fewest(candidates, need) == chosen


def test_under_reclaim_a_default_unloaded_for_idleness_waits_to_be_asked_for() -> None:
    cfg = config(default="a", policy="reclaim", reclaim_after=60.0, idle_unload_after=40.0)
    state = replace(pool({"b": 1.0}, cfg),
                    idle_unloads={"a": r.IdleUnload("a", 0.0, 40.0)})
    state, actions = run(state, [(100.0, Tick())])
    assert scales(actions) == {} and state.loads == ()
    assert r._reclaim_due_at(state) is None
    state, actions = run(state, [(101.0, ask("a"))])
    assert scales(actions) == {"a": 1} and state.idle_unloads == {}


def test_a_member_running_though_the_pool_wants_none_of_it_is_scaled_down() -> None:
    # b runs (scaled by hand, or left from before a restart) but is no resident: it holds
    # room nobody accounted for, so the next load scales it down, and waits for it
    state = replace(pool({"a": 1.0}), observed=ready("a", "b"))
    state, actions = run(state, [(10.0, ask("d"))])
    assert scales(actions) == {"b": 0, "d": 1}
    assert "d" not in r.released(state)
