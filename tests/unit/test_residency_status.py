"""reconciler/residency_status.py: a budgeted pool's status from its residency state, and
the state read back from that status (what a restarted reconciler carries on from)."""

from __future__ import annotations

import pytest

from reconciler import residency as r
from reconciler import residency_status as rs

pytestmark = pytest.mark.unit

GIB = 1 << 30
CONFIG = r.ResidencyConfig(members=("a", "b", "c"), default="a", gpu_memory=16 * GIB,
                           footprints={"a": 8 * GIB, "b": 6 * GIB, "c": 10 * GIB})


def state() -> r.ResidencyState:
    return r.ResidencyState(
        config=CONFIG, generation=3, request=r.Request("c", 7),
        residents={"a": r.Resident("a", 100.0, 150.0), "b": r.Resident("b", 120.0, 130.0)},
        loads=(r.Load(to="c", generation=7, phase=r.Phase.UNLOADING, started=200.0,
                      phase_started=201.0, victims=("b",), staged=True),),
        last_load=r.LastLoad(to="b", generation=6, start=110.0, duration=10.0,
                             outcome=r.Outcome.SUCCEEDED))


def test_status_lists_the_residents_the_room_and_the_loads() -> None:
    status = rs.pool_status(state(), None, 300.0)
    assert [(x["name"], x["gpuMemory"]) for x in status["residents"]] == [
        ("a", 8 * GIB), ("b", 6 * GIB)]
    assert status["residentMembers"] == "a,b"
    assert status["residentMember"] == "b"  # the resident loaded last
    # c is promised: its footprint is counted while b unloads
    assert status["roomLeft"] == 16 * GIB - 8 * GIB - 6 * GIB - 10 * GIB
    assert status["loads"] == [{"to": "c", "generation": 7, "phase": "Unloading",
                                "startedAt": "1970-01-01T00:03:20Z", "victims": ["b"]}]
    assert status["swap"]["from"] == "b" and status["swap"]["to"] == "c"
    assert status["phase"] == "Swapping"
    assert status["lastSwap"]["evicted"] == []
    assert [m["resident"] for m in status["members"]] == [True, True, False]
    assert [m["gpuMemory"] for m in status["members"]] == [
        CONFIG.footprints[m] for m in CONFIG.members]


def test_the_state_read_back_from_status_carries_on() -> None:
    status = {**rs.pool_status(state(), None, 300.0),
              "request": {"member": "c", "generation": 7}}
    back = rs.restore(CONFIG, 3, status)
    assert back.residents == state().residents
    (load,) = back.loads
    assert (load.to, load.generation, load.phase, load.victims, load.staged) == (
        "c", 7, r.Phase.UNLOADING, ("b",), True)
    assert back.request == r.Request("c", 7)
    assert back.last_load is not None and back.last_load.generation == 6
    assert back.answered == 6


def test_status_naming_members_the_pool_no_longer_has_is_not_trusted() -> None:
    status = {"residents": [{"name": "gone", "since": "1970-01-01T00:01:40Z"}],
              "loads": [{"to": "gone", "phase": "Loading", "startedAt": "1970-01-01T00:01:40Z"},
                        {"to": "c", "phase": "Sideways", "startedAt": "1970-01-01T00:01:40Z"}]}
    back = rs.restore(CONFIG, 1, status)
    assert back.residents == {} and back.loads == ()
