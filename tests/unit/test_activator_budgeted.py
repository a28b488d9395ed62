"""Tables for the activator on a pool with a memory budget: its status lists a set of
`residents` and the `loads` under way, each with its victims (sidecar.activator)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.activator import (
    Admit,
    Arrive,
    EarlyReady,
    EndpointsObserved,
    Leave,
    PoolObserved,
    PoolRequest,
    PoolStatus,
    SwapProgress,
    Tick,
    early_address,
    is_resident,
    member_state,
    next_wakeup,
    probe_wanted,
    waiters,
)
from tests.unit.test_activator import LIMITS, OTHER, Case, cas, pool, req, run, scrub

pytestmark = pytest.mark.unit

ADDRESS = "127.0.1.9:8080"
BOTH_READY = frozenset({"coder", "gemma"})
FAIR = replace(LIMITS, max_wait=10.0)


def load(to: str, gen: int | None, phase: str, *victims: str) -> SwapProgress:
    return SwapProgress(victims[0] if victims else None, to, gen, phase, None, victims)


def budgeted(
    rv: int,
    residents: tuple[str, ...] = ("coder", "gemma"),
    request: PoolRequest | None = None,
    loads: tuple[SwapProgress, ...] = (),
    last_loaded: str | None = "gemma",
) -> PoolStatus:
    """A budgeted pool's status as the reconciler writes it: `swap` is the first load."""
    swap = replace(loads[0], victims=()) if loads else None
    return PoolStatus(
        "heavy", str(rv), True, last_loaded, request, swap, None, frozenset(residents), loads
    )


SET = budgeted(20, request=req("gemma", 4))  # coder and gemma resident, nothing under way
PHI_ASKED = budgeted(21, request=req("phi", 5))
PHI_DRAINING = budgeted(22, request=req("phi", 5), loads=(load("phi", 5, "Draining", "coder"),))
PHI_UNLOADING = budgeted(
    23, request=req("phi", 5), loads=(load("phi", 5, "Unloading", "coder"),)
)
PHI_LOADING = budgeted(
    24, ("gemma",), req("phi", 5), (load("phi", 5, "Loading", "coder"),)
)
PHI_RESIDENT = budgeted(25, ("gemma", "phi"), req("phi", 5), last_loaded="phi")

CASES = [
    Case(
        "two residents: a request for each is served at once, nothing is written",
        pool(SET, ready=BOTH_READY),
        [(0, Arrive(1, "coder")), (1, Arrive(2, "gemma")), (2, Arrive(3, "coder"))],
        [Admit(1, "coder", None), Admit(2, "gemma", None), Admit(3, "coder", None)],
    ),
    Case(
        "a member outside the set is held and requested; the residents still serve",
        pool(SET, ready=BOTH_READY),
        [(0, Arrive(1, "phi")), (1, Arrive(2, "coder")), (2, Arrive(3, "gemma"))],
        [cas("phi", 5, req("gemma", 4), 20), Admit(2, "coder", None), Admit(3, "gemma", None)],
        held=[1],
    ),
    Case(
        "an empty set is a budgeted pool with nothing resident, whatever residentMember says",
        pool(budgeted(20, (), req(None, 3), last_loaded="coder"), ready=frozenset({"coder"})),
        [(0, Arrive(1, "coder"))],
        [cas("coder", 4, req(None, 3), 20)],
        held=[1],
    ),
    Case(
        "released once its member appears among the residents with a ready endpoint",
        pool(PHI_ASKED, ready=BOTH_READY),
        [
            (0, Arrive(1, "phi")),
            (5, PoolObserved(PHI_RESIDENT)),
            (6, EndpointsObserved(frozenset({"gemma", "phi"}))),
        ],
        [Admit(1, "phi", 6.0)],
    ),
    Case(
        "the request is settled once its member is resident: the next one is written",
        pool(replace(PHI_RESIDENT, resident_member="gemma"), ready=frozenset({"gemma", "phi"})),
        [(0, Arrive(1, "coder"))],
        [cas("coder", 6, req("phi", 5), 25)],
        held=[1],
    ),
    Case(
        "a resident whose endpoint is not ready yet is held, not requested again",
        pool(PHI_RESIDENT, ready=frozenset({"gemma"})),
        [(0, Arrive(1, "phi")), (2, EndpointsObserved(frozenset({"gemma", "phi"})))],
        [Admit(1, "phi", 2.0)],
    ),
    Case(
        "a victim serves while its load drains, and is held once the load is past Draining",
        pool(replace(PHI_DRAINING, request=req("phi", 5, OTHER)), ready=BOTH_READY),
        [
            (0, Arrive(1, "coder")),
            (1, PoolObserved(replace(PHI_UNLOADING, request=req("phi", 5, OTHER)))),
            (2, Arrive(2, "coder")),
            (3, Arrive(3, "gemma")),
        ],
        [Admit(1, "coder", None), Admit(3, "gemma", None)],
        held=[2],
    ),
    Case(
        "an evicted victim is requested again: the load that evicted it settled its request",
        pool(PHI_LOADING, ready=frozenset({"gemma"})),
        [(0, Arrive(1, "coder"))],
        [cas("coder", 6, req("phi", 5), 24)],
        held=[1],
    ),
    Case(
        "a load past Draining settles its request: the next member is asked for beside it",
        pool(budgeted(23, ("gemma",), req("phi", 5), (load("phi", 5, "Unloading"),))),
        [(0, Arrive(1, "phi")), (1, Arrive(2, "coder"))],
        [cas("coder", 6, req("phi", 5), 23)],
        held=[1, 2],
    ),
    Case(
        "a load still Draining keeps its request: the next member waits its turn",
        pool(budgeted(22, ("gemma",), req("phi", 5), (load("phi", 5, "Draining", "gemma"),))),
        [(0, Arrive(1, "phi")), (1, Arrive(2, "coder"))],
        [],
        held=[1, 2],
    ),
    Case(
        "a member being loaded is not asked for again",
        pool(
            budgeted(
                26,
                ("gemma",),
                req("coder", 6, OTHER),
                (load("phi", 5, "Loading"), load("coder", 6, "Unloading")),
            ),
            ready=frozenset({"gemma"}),
        ),
        [(0, Arrive(1, "phi")), (1, Arrive(2, "coder"))],
        [],
        held=[1, 2],
    ),
    Case(
        "fair: the cutoff stops admission to the draining load's victims only",
        pool(replace(PHI_DRAINING, request=req("phi", 5, OTHER)), BOTH_READY, FAIR),
        [
            (0, Arrive(1, "phi")),
            (5, Arrive(2, "coder")),
            (11, Arrive(3, "coder")),
            (11, Arrive(4, "gemma")),
        ],
        [Admit(2, "coder", None), Admit(4, "gemma", None)],
        held=[1, 3],
    ),
    Case(
        "fair: no cutoff while no load drains, however long a waiter waited",
        pool(replace(PHI_ASKED, request=req("phi", 5, OTHER)), BOTH_READY, FAIR),
        [(0, Arrive(1, "phi")), (11, Arrive(2, "coder")), (12, Arrive(3, "gemma"))],
        [Admit(2, "coder", None), Admit(3, "gemma", None)],
        held=[1],
    ),
    Case(
        "fair: a victim held at the cutoff is admitted if the load is withdrawn",
        pool(replace(PHI_DRAINING, request=req("phi", 5, OTHER)), BOTH_READY, FAIR),
        [
            (0, Arrive(1, "phi")),
            (11, Arrive(2, "coder")),
            (12, PoolObserved(replace(SET, resource_version="26", request=req(None, 6, OTHER)))),
        ],
        [Admit(2, "coder", 1.0), cas("phi", 7, req(None, 6, OTHER), 26)],
        held=[1],
    ),
    Case(
        "withdrawn while its load drains: our waiters left before any victim was evicted",
        pool(PHI_DRAINING, ready=BOTH_READY),
        [(0, Arrive(1, "phi")), (1, Leave(1, "phi"))],
        [cas(None, 6, req("phi", 5), 22)],
    ),
    Case(
        "kept once any load for it is past Draining, not only the first one",
        pool(
            budgeted(
                23,
                ("gemma",),
                req("phi", 5),
                (load("coder", 4, "Loading"), load("phi", 5, "Unloading", "gemma")),
            ),
            ready=frozenset({"gemma"}),
        ),
        [(0, Arrive(1, "phi")), (1, Leave(1, "phi")), (2, Tick())],
        [],
    ),
    Case(
        "the early answer of a load's target in Loading releases its requests",
        pool(PHI_LOADING, ready=frozenset({"gemma"})),
        [(0, Arrive(1, "phi")), (3, EarlyReady("phi", ADDRESS)), (4, Arrive(2, "phi"))],
        [Admit(1, "phi", 3.0), Admit(2, "phi", None)],
    ),
    Case(
        "an early answer of a load's target still Unloading does not count",
        pool(PHI_UNLOADING, ready=BOTH_READY),
        [(0, Arrive(1, "phi")), (3, EarlyReady("phi", ADDRESS))],
        [],
        held=[1],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_budgeted_table(case: Case) -> None:
    state, actions = run(case.given, case.events)
    assert scrub(actions) == case.actions
    assert [w.id for w in waiters(state)] == case.held


def test_probe_wanted_names_the_target_of_a_load_in_loading() -> None:
    two = budgeted(
        24,
        ("gemma",),
        req("phi", 5),
        (load("coder", 4, "Unloading"), load("phi", 5, "Loading", "coder")),
    )
    state, _ = run(pool(two, ready=frozenset({"gemma"})), [(0, Arrive(1, "phi"))])
    assert probe_wanted(state) == "phi"
    assert probe_wanted(pool(two, ready=frozenset({"gemma"}))) is None  # nobody waits
    unloading, _ = run(pool(PHI_UNLOADING, ready=BOTH_READY), [(0, Arrive(1, "phi"))])
    assert probe_wanted(unloading) is None
    early, _ = run(state, [(1, EarlyReady("phi", ADDRESS))])
    assert probe_wanted(early) is None
    assert early_address(early, "phi") == ADDRESS
    assert is_resident(early, "phi")


def test_one_early_answer_at_a_time() -> None:
    both = budgeted(
        24,
        ("gemma",),
        req("phi", 5),
        (load("coder", 4, "Loading"), load("phi", 5, "Loading", "coder")),
    )
    state, _ = run(
        pool(both, ready=frozenset({"gemma"})), [(0, Arrive(1, "coder")), (0, Arrive(2, "phi"))]
    )
    assert probe_wanted(state) == "coder"  # the oldest load first
    state, actions = run(state, [(1, EarlyReady("coder", ADDRESS))])
    assert actions == [Admit(1, "coder", 1.0)]
    assert probe_wanted(state) is None  # phi waits for its endpoint, or for coder's


def test_an_early_answer_ends_when_its_resident_is_being_unloaded() -> None:
    evicting = replace(PHI_UNLOADING, request=req("phi", 5, OTHER))
    state, _ = run(
        pool(replace(SET, request=req("gemma", 4, OTHER)), ready=frozenset({"gemma"})),
        [(0, EarlyReady("coder", ADDRESS))],
    )
    assert early_address(state, "coder") == ADDRESS
    drain = load("phi", 5, "Draining", "coder")
    draining, _ = run(state, [(1, PoolObserved(budgeted(22, request=req("phi", 5, OTHER),
                                                         loads=(drain,))))])
    assert early_address(draining, "coder") == ADDRESS  # a victim serves while it drains
    state, _ = run(draining, [(2, PoolObserved(evicting))])
    assert early_address(state, "coder") is None
    assert not is_resident(state, "coder")


def test_member_states_of_a_budgeted_pool() -> None:
    state = pool(SET, ready=BOTH_READY)
    assert [member_state(state, m) for m in ("coder", "gemma", "phi")] == [
        "resident",
        "resident",
        "stopped",
    ]
    assert member_state(pool(SET, ready=frozenset({"gemma"})), "coder") == "loading"
    assert member_state(pool(PHI_ASKED, ready=BOTH_READY), "phi") == "loading"
    assert member_state(pool(PHI_DRAINING, ready=BOTH_READY), "coder") == "resident"
    assert member_state(pool(PHI_UNLOADING, ready=BOTH_READY), "coder") == "stopped"
    loading = pool(replace(PHI_LOADING, request=req("gemma", 6)), ready=frozenset({"gemma"}))
    assert member_state(loading, "phi") == "loading"
    assert member_state(loading, "coder") == "stopped"


def test_fair_turn_wakes_the_machine_for_a_draining_load() -> None:
    state, _ = run(pool(PHI_DRAINING, BOTH_READY, FAIR), [(0, Arrive(1, "phi"))])
    assert next_wakeup(state, 1) == 10.0
    fits = budgeted(23, request=req("phi", 5), loads=(load("phi", 5, "Unloading"),))
    state, _ = run(pool(fits, BOTH_READY, FAIR), [(0, Arrive(1, "phi"))])
    assert next_wakeup(state, 1) == 60.0  # nobody is evicted for it: no fair turn, the budget
