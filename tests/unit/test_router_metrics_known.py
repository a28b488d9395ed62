"""The router starts the series of every pooled member at 0 when it loads a config."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.metrics import RouterMetrics
from tests.functional.test_activation import router_config

pytestmark = pytest.mark.unit


def test_a_loaded_config_starts_each_pooled_members_series_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, "chat")
    metrics.known(router_config())
    for member in ("coder", "gemma"):
        labels = {"router": "chat", "pool": "heavy", "member": member}
        assert registry.get_sample_value("modelpool_held_requests", labels) == 0
        assert registry.get_sample_value("modelpool_hold_duration_seconds_count", labels) == 0
        assert registry.get_sample_value("modelpool_coalesced_total", labels) == 0
        assert registry.get_sample_value("modelpool_errors_total", {
            "router": "chat", "model": member, "code": "503",
            "reason": "swap_budget_exceeded"}) == 0
    # a backend outside any pool gets no activation series
    assert registry.get_sample_value("modelpool_errors_total", {
        "router": "chat", "model": "external", "code": "503",
        "reason": "swap_budget_exceeded"}) is None
