"""Tables for the activator's early readiness: a swap's target that answers its readiness
probe before its endpoint turns ready (sidecar.activator `EarlyReady`, `probe_wanted`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.activator import (
    Admit,
    Arrive,
    EarlyLost,
    EarlyReady,
    EndpointsObserved,
    PoolObserved,
    SwapProgress,
    early_address,
    is_resident,
    member_state,
    probe_wanted,
    waiters,
)
from tests.unit.test_activator import (
    DRAINING,
    GEMMA_ASKED,
    GEMMA_RESIDENT,
    LOADING,
    UNLOADING,
    Case,
    pool,
    req,
    run,
    scrub,
    status,
)

pytestmark = pytest.mark.unit

ADDRESS = "127.0.1.7:8080"
# The incumbent's pods are gone once the reconciler enters Loading (docs/contracts.md 2).
GONE = frozenset[str]()
LOADING_PHI = status(15, request=req("phi", 5), swap=SwapProgress("gemma", "phi", 5, "Loading"))
GEMMA_DONE = replace(GEMMA_RESIDENT, request=req("gemma", 4))

CASES = [
    Case(
        "released on the healthy probe while the swap to it is Loading",
        pool(LOADING, ready=GONE),
        [(0, Arrive(1, "gemma")), (3, EarlyReady("gemma", ADDRESS))],
        [Admit(1, "gemma", 3.0)],
    ),
    Case(
        "a later request for it is served at once on the early address",
        pool(LOADING, ready=GONE),
        [(0, Arrive(1, "gemma")), (3, EarlyReady("gemma", ADDRESS)), (4, Arrive(2, "gemma"))],
        [Admit(1, "gemma", 3.0), Admit(2, "gemma", None)],
    ),
    Case(
        "not released while the swap is Draining: the incumbent still runs",
        pool(DRAINING),
        [(0, Arrive(1, "gemma")), (3, EarlyReady("gemma", ADDRESS))],
        [],
        held=[1],
    ),
    Case(
        "not released while the incumbent is Unloading",
        pool(UNLOADING, ready=GONE),
        [(0, Arrive(1, "gemma")), (3, EarlyReady("gemma", ADDRESS))],
        [],
        held=[1],
    ),
    Case(
        "an early answer heard before Loading does not count once Loading is seen",
        pool(UNLOADING, ready=GONE),
        [
            (0, Arrive(1, "gemma")),
            (3, EarlyReady("gemma", ADDRESS)),
            (4, PoolObserved(LOADING)),
        ],
        [],
        held=[1],
    ),
    Case(
        "not released for a member that is not the swap's target",
        pool(LOADING, ready=GONE),
        [(0, Arrive(1, "phi")), (3, EarlyReady("phi", ADDRESS))],
        [],
        held=[1],
    ),
    Case(
        "not released for a member nobody asked for",
        pool(GEMMA_ASKED),
        [(0, Arrive(1, "gemma")), (3, EarlyReady("gemma", ADDRESS))],
        [],
        held=[1],
    ),
    Case(
        "a newer swap to another member stops it",
        pool(LOADING, ready=GONE),
        [
            (0, Arrive(1, "gemma")),
            (3, EarlyReady("gemma", ADDRESS)),
            (5, PoolObserved(LOADING_PHI)),
            (6, Arrive(2, "gemma")),
        ],
        [Admit(1, "gemma", 3.0)],
        held=[2],
    ),
    Case(
        "the address going away stops it",
        pool(LOADING, ready=GONE),
        [
            (0, Arrive(1, "gemma")),
            (3, EarlyReady("gemma", ADDRESS)),
            (4, EarlyLost("gemma", ADDRESS)),
            (5, Arrive(2, "gemma")),
        ],
        [Admit(1, "gemma", 3.0)],
        held=[2],
    ),
    Case(
        "another address going away changes nothing",
        pool(LOADING, ready=GONE),
        [
            (0, Arrive(1, "gemma")),
            (3, EarlyReady("gemma", ADDRESS)),
            (4, EarlyLost("gemma", "127.0.1.9:8080")),
            (5, Arrive(2, "gemma")),
        ],
        [Admit(1, "gemma", 3.0), Admit(2, "gemma", None)],
    ),
    Case(
        "it carries over the end of the swap until the endpoint turns ready",
        pool(LOADING, ready=GONE),
        [
            (0, Arrive(1, "gemma")),
            (3, EarlyReady("gemma", ADDRESS)),
            (4, PoolObserved(GEMMA_DONE)),
            (5, Arrive(2, "gemma")),
            (6, EndpointsObserved(frozenset({"gemma"}))),
            (7, Arrive(3, "gemma")),
        ],
        [Admit(1, "gemma", 3.0), Admit(2, "gemma", None), Admit(3, "gemma", None)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_early_ready_table(case: Case) -> None:
    state, actions = run(case.given, case.events)
    assert scrub(actions) == case.actions
    assert [w.id for w in waiters(state)] == case.held


def test_probe_is_wanted_only_for_a_loading_target_with_waiters() -> None:
    loading = pool(LOADING, ready=GONE)
    assert probe_wanted(loading) is None  # nobody waits here
    held, _ = run(loading, [(0, Arrive(1, "gemma"))])
    assert probe_wanted(held) == "gemma"
    for st in (GEMMA_ASKED, DRAINING, UNLOADING):
        waiting, _ = run(pool(st, ready=GONE), [(0, Arrive(1, "gemma"))])
        assert probe_wanted(waiting) is None, st.swap
    answered, _ = run(held, [(1, Arrive(2, "phi")), (2, EarlyReady("gemma", ADDRESS))])
    assert probe_wanted(answered) is None  # it answered: nothing more to probe
    ready, _ = run(held, [(1, EndpointsObserved(frozenset({"gemma"})))])
    assert probe_wanted(ready) is None  # the normal path serves it


def test_early_address_and_member_state() -> None:
    state, _ = run(
        pool(LOADING, ready=GONE), [(0, Arrive(1, "gemma")), (1, EarlyReady("gemma", ADDRESS))]
    )
    assert early_address(state, "gemma") == ADDRESS
    assert early_address(state, "coder") is None
    assert is_resident(state, "gemma") and not is_resident(state, "coder")
    assert member_state(state, "gemma") == "resident"
    ready, _ = run(state, [(2, EndpointsObserved(frozenset({"gemma"})))])
    assert early_address(ready, "gemma") is None
    assert ready.early is None


def test_a_target_whose_slots_are_restored_is_never_served_early() -> None:
    assert LOADING.swap is not None
    restoring = replace(LOADING, swap=replace(LOADING.swap, restores=True))
    held, _ = run(pool(restoring, ready=GONE), [(0, Arrive(1, "gemma"))])
    assert probe_wanted(held) is None  # no early answer would count
    state, actions = run(held, [(1, EarlyReady("gemma", ADDRESS))])
    assert not is_resident(state, "gemma") and early_address(state, "gemma") is None
    assert [w.id for w in waiters(state)] == [1]
    assert not any(isinstance(a, Admit) for a in actions)
