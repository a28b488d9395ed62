"""Retry-After from recent swap durations (sidecar.retry_after)."""

from __future__ import annotations

import pytest

from sidecar.retry_after import retry_after_seconds, typical_swap_seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("recent", "budget", "elapsed", "expected"),
    [
        ([], 300.0, None, 75.0),  # nothing seen yet: a quarter of the budget
        ([], 2.0, None, 1.0),  # never below one second
        ([30.0], 300.0, None, 30.0),
        ([30.0], 300.0, 25.0, 5.0),  # the swap waited for is nearly done
        ([30.0], 300.0, 40.0, 1.0),  # overdue: retry soon
        ([10.0, 12.0, 200.0], 300.0, None, 12.0),  # one slow outlier does not dominate
        ([10.0, 20.0], 300.0, None, 20.0),  # the upper median
        ([4.2], 300.0, None, 5.0),  # whole seconds, rounded up
        ([900.0], 300.0, None, 300.0),  # never beyond the budget
    ],
)
def test_retry_after(
    recent: list[float], budget: float, elapsed: float | None, expected: float
) -> None:
    assert retry_after_seconds(recent, budget=budget, elapsed=elapsed) == expected


def test_typical_of_nothing_is_unknown() -> None:
    assert typical_swap_seconds([]) is None
