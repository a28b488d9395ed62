"""The reconciler's series start at 0 when a pool is seen, and go with it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from reconciler.metrics import ReconcilerMetrics

pytestmark = pytest.mark.unit


def test_a_pools_series_start_at_zero_and_go_with_the_pool() -> None:
    registry = CollectorRegistry()
    metrics = ReconcilerMetrics(registry)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"namespace": "ns", "pool": "p", **labels})

    metrics.pool_seen("ns", "p", ("a", "b"))
    assert value("modelpool_swaps_total", **{"from": "a", "to": "b"}) == 0
    assert value("modelpool_swaps_total", **{"from": "", "to": "a"}) == 0
    assert value("modelpool_swap_duration_seconds_count") == 0
    assert value("modelpool_swap_phase_duration_seconds_count", phase="load") == 0
    assert value("modelpool_swap_failures_total", member="b", reason="SwapBudgetExceeded") == 0
    assert value("modelpool_swap_deferrals_total", reason="PodsBusy") == 0
    assert value("modelpool_idle_unloads_total", member="a") == 0
    metrics.swap_done("ns", "p", "a", "b", 3.0, [("load", 2.0)])
    assert value("modelpool_swaps_total", **{"from": "a", "to": "b"}) == 1
    # a member leaves: its series go, the others' stay
    metrics.pool_seen("ns", "p", ("a",))
    assert value("modelpool_idle_unloads_total", member="b") is None
    assert value("modelpool_idle_unloads_total", member="a") == 0
    metrics.forget_pool("ns", "p", ("a",))
    assert value("modelpool_swaps_total", **{"from": "", "to": "a"}) is None
    assert value("modelpool_swap_duration_seconds_count") is None
