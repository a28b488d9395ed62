"""The reconciler's series start at 0 when a pool is seen, and go with it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, enable_created_metrics, generate_latest

from reconciler.metrics import DEFERRAL_REASONS, FAILURE_REASONS, PHASES, ReconcilerMetrics

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


def pool_samples(registry: CollectorRegistry, pool: str) -> list[str]:
    """The lines of a scrape that belong to `pool`, without the `_created` series (the
    reconciler's process exports none: `test_the_reconciler_exports_no_created_series`)."""
    return [line for line in generate_latest(registry).decode().splitlines()
            if f'pool="{pool}"' in line and "_created{" not in line]


def test_a_pool_of_three_members_costs_a_bounded_number_of_samples() -> None:
    """Every sample costs a scrape some microseconds: at 500 pools the 126 a pool of three
    members once had (its six phases on the swap's twelve buckets) made one exposition take
    most of a second of CPU. A pool's swap, through every phase, adds no series."""
    registry = CollectorRegistry()
    metrics = ReconcilerMetrics(registry)
    members = ("a", "b", "c")
    metrics.pool_seen("ns", "p", members)
    metrics.set_resident("ns", "p", members, "a")
    seen = len(pool_samples(registry, "p"))
    metrics.swap_done("ns", "p", "a", "b", 30.0, [(phase, 5.0) for phase in PHASES])
    metrics.swap_failures_total.labels("ns", "p", "c", FAILURE_REASONS[0]).inc()
    metrics.swap_deferrals_total.labels("ns", "p", DEFERRAL_REASONS[0]).inc()
    metrics.idle_unloads_total.labels("ns", "p", "b").inc()
    assert len(pool_samples(registry, "p")) == seen
    assert seen <= 90, seen


def test_the_reconciler_exports_no_created_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its process leaves out the `_created` series prometheus-client adds beside every
    counter and histogram: nothing reads them, and a pool of three members has 28."""
    import reconciler.__main__ as entry

    async def run(settings: object) -> None:
        return None

    monkeypatch.setattr(entry, "run", run)
    monkeypatch.setattr(entry, "setup_logging", lambda level: None)
    registry = CollectorRegistry()
    Counter("modelpool_probe_total", "A counter.", registry=registry).inc()
    try:
        assert entry.main(["--namespace", "ns"]) == 0
        assert "_created" not in generate_latest(registry).decode()
    finally:
        # process-wide: the other tests' default again
        enable_created_metrics()  # type: ignore[no-untyped-call]
