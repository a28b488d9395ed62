"""kstatus conditions: what each combination says, and stable transition times."""

from __future__ import annotations

import pytest

from reconciler.conditions import Condition, find, kstatus, merge

pytestmark = pytest.mark.unit


def by_type(conditions: list[Condition]) -> dict[str, tuple[bool, str]]:
    return {c.type: (c.status, c.reason) for c in conditions}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"ready": (True, "Resident", "a")},
            {"Ready": (True, "Resident"), "Reconciling": (False, "Reconciled"),
             "Stalled": (False, "Valid")},
        ),
        (
            {"ready": (False, "Swapping", ""), "reconciling": ("Swapping", "a -> b")},
            {"Ready": (False, "Swapping"), "Reconciling": (True, "Swapping"),
             "Stalled": (False, "Valid")},
        ),
        (
            {"ready": (True, "Resident", ""), "reconciling": ("Swapping", ""),
             "stalled": ("MemberNotFound", "b")},
            {"Ready": (False, "MemberNotFound"), "Reconciling": (False, "Reconciled"),
             "Stalled": (True, "MemberNotFound")},
        ),
    ],
)
def test_kstatus_combinations(
    kwargs: dict[str, object], expected: dict[str, tuple[bool, str]]
) -> None:
    assert by_type(kstatus(**kwargs)) == expected  # type: ignore[arg-type]


def test_merge_keeps_the_transition_time_while_the_status_holds() -> None:
    first = merge(None, [Condition("Ready", True, "A")], now="t1", observed_generation=1)
    assert first == [
        {"type": "Ready", "status": "True", "reason": "A", "message": "",
         "lastTransitionTime": "t1", "observedGeneration": 1}
    ]
    same = merge(first, [Condition("Ready", True, "B", "m")], now="t2", observed_generation=2)
    assert same[0]["lastTransitionTime"] == "t1"
    assert (same[0]["reason"], same[0]["observedGeneration"]) == ("B", 2)
    flipped = merge(same, [Condition("Ready", False, "C")], now="t3", observed_generation=2)
    assert flipped[0]["lastTransitionTime"] == "t3"
    assert find(flipped, "Ready") == flipped[0]
    assert find(flipped, "Stalled") is None
