"""The router's per-request metric helpers keep their labelled children: each model and
status code still counts on its own, and a fresh registry starts from nothing."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.metrics import RouterMetrics

pytestmark = pytest.mark.unit


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"router": "chat", **labels})


def test_cached_children_still_count_per_model_and_code() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, "chat")
    for model, code, seconds in [
        ("coder", 200, 0.002),
        ("coder", 200, 0.2),
        ("coder", 502, 0.003),
        ("gemma", 200, 7.0),
    ]:
        metrics.request_done(model, code, seconds, "chat")
    metrics.request_done("coder", 200, 0.1, "messages")
    metrics.first_byte("coder", 0.0005)
    metrics.first_byte("gemma", 2.0)
    metrics.first_byte("gemma", 2.0)

    total = "modelpool_requests_total"
    assert _value(registry, total, model="coder", code="200", api="chat") == 2
    assert _value(registry, total, model="coder", code="200", api="messages") == 1
    assert _value(registry, total, model="coder", code="502", api="chat") == 1
    assert _value(registry, total, model="gemma", code="200", api="chat") == 1
    assert _value(registry, total, model="gemma", code="502", api="chat") is None
    duration = "modelpool_request_duration_seconds"
    assert _value(registry, duration + "_count", model="coder") == 4
    assert _value(registry, duration + "_sum", model="coder") == pytest.approx(0.305)
    assert _value(registry, duration + "_bucket", model="coder", le="0.005") == 2
    assert _value(registry, duration + "_count", model="gemma") == 1
    ttfb = "modelpool_time_to_first_byte_seconds"
    assert _value(registry, ttfb + "_count", model="coder") == 1
    assert _value(registry, ttfb + "_bucket", model="coder", le="0.001") == 1
    assert _value(registry, ttfb + "_count", model="gemma") == 2
    assert _value(registry, ttfb + "_bucket", model="gemma", le="1.0") == 0


def test_each_router_metrics_counts_on_its_own_registry() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    RouterMetrics(first, "chat").request_done("coder", 200, 0.01, "chat")
    RouterMetrics(second, "chat")
    assert _value(first, "modelpool_requests_total", model="coder", code="200", api="chat") == 1
    assert _value(second, "modelpool_requests_total", model="coder", code="200",
                  api="chat") is None


def test_an_observation_on_a_bound_counts_in_that_bucket_and_one_past_the_last_only_in_inf(
) -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, "chat")
    metrics.request_done("coder", 200, 0.005)  # exactly on a bound: `le` includes it
    metrics.request_done("coder", 200, 1000.0)  # past the last bound (600)
    duration = "modelpool_request_duration_seconds_bucket"
    assert _value(registry, duration, model="coder", le="0.001") is None  # not a bound
    assert _value(registry, duration, model="coder", le="0.005") == 1
    assert _value(registry, duration, model="coder", le="600.0") == 1
    assert _value(registry, duration, model="coder", le="+Inf") == 2
    assert _value(registry, "modelpool_request_duration_seconds_sum", model="coder") == (
        pytest.approx(1000.005))
