"""The router's Prometheus metrics, on an injected registry.

One object holds every router family so that the activator, the proxy and the health
server share the same collectors, and tests can assert on a fresh registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.activator import (
    SHUTTING_DOWN,
    SWAP_ABANDONED,
    SWAP_BUDGET_EXCEEDED,
    TOO_MANY_HELD_REQUESTS,
)
from sidecar.config import RouterConfig

# The 503s a held request for a pooled backend can get (sidecar.activator), started at 0.
ACTIVATION_REASONS = (SWAP_BUDGET_EXCEEDED, TOO_MANY_HELD_REQUESTS, SWAP_ABANDONED,
                      SHUTTING_DOWN)

PREFIX = "modelpool_"

# Holds last as long as a swap (seconds to minutes); requests as long as a generation.
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
_TTFB_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class RouterMetrics:
    """Every router metric family, labelled with this router's name."""

    def __init__(self, registry: CollectorRegistry, router: str) -> None:
        self.router = router
        self.held_requests = Gauge(
            PREFIX + "held_requests",
            "Requests currently held open waiting for a pool member to become resident.",
            ["router", "pool", "member"],
            registry=registry,
        )
        self.hold_duration_seconds = Histogram(
            PREFIX + "hold_duration_seconds",
            "How long a request was held open waiting for activation.",
            ["router", "pool", "member"],
            buckets=_HOLD_BUCKETS,
            registry=registry,
        )
        self.coalesced_total = Counter(
            PREFIX + "coalesced_total",
            "Requests served on the resident member without a swap.",
            ["router", "pool", "member"],
            registry=registry,
        )
        self.requests_total = Counter(
            PREFIX + "requests_total",
            "Requests answered by the router, by requested model and HTTP status code.",
            ["router", "model", "code"],
            registry=registry,
        )
        self.request_duration_seconds = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from receiving a request to the end of its response.",
            ["router", "model"],
            buckets=_REQUEST_BUCKETS,
            registry=registry,
        )
        self.time_to_first_byte_seconds = Histogram(
            PREFIX + "time_to_first_byte_seconds",
            "Time from receiving a request to sending the first byte of its response body.",
            ["router", "model"],
            buckets=_TTFB_BUCKETS,
            registry=registry,
        )
        self._requests: dict[tuple[str, int], Counter] = {}
        self._durations: dict[str, Histogram] = {}
        self._ttfb: dict[str, Histogram] = {}
        self.errors_total = Counter(
            PREFIX + "errors_total",
            "Error answers the router gave itself, by backend, HTTP status and the error's "
            "OpenAI code (the 503s' reasons: swap_budget_exceeded, too_many_held_requests, "
            "swap_abandoned, shutting_down, router_out_of_connections, ...).",
            ["router", "model", "code", "reason"],
            registry=registry,
        )
        self.upstream_errors_total = Counter(
            PREFIX + "upstream_errors_total",
            "Failed upstream calls, by backend and kind (connect, timeout, disconnect).",
            ["router", "backend", "kind"],
            registry=registry,
        )

    # Helpers taking the labels other than `router`.

    def held(self, pool: str, member: str) -> Gauge:
        """The held-requests gauge child of one pool member (use inc/dec)."""
        return self.held_requests.labels(self.router, pool, member)

    def observe_hold(self, pool: str, member: str, seconds: float) -> None:
        self.hold_duration_seconds.labels(self.router, pool, member).observe(seconds)

    def coalesced(self, pool: str, member: str) -> None:
        self.coalesced_total.labels(self.router, pool, member).inc()

    # The per-request helpers keep their children: `labels()` takes a lock and builds a
    # key on every call, a cost paid on every proxied request. Label values are bounded
    # (backend names and status codes), and so are these caches.

    def request_done(self, model: str, code: int, seconds: float) -> None:
        counter = self._requests.get((model, code))
        if counter is None:
            counter = self.requests_total.labels(self.router, model, str(code))
            self._requests[(model, code)] = counter
        counter.inc()
        self._by_model(self._durations, self.request_duration_seconds, model).observe(seconds)

    def first_byte(self, model: str, seconds: float) -> None:
        self._by_model(self._ttfb, self.time_to_first_byte_seconds, model).observe(seconds)

    def _by_model(self, cache: dict[str, Histogram], family: Histogram, model: str) -> Histogram:
        child = cache.get(model)
        if child is None:
            child = cache[model] = family.labels(self.router, model)
        return child

    def known(self, config: RouterConfig) -> None:
        """Start the series of every pooled member and every backend at 0 when a config is
        loaded, so the first hold, coalesced request or 503 shows as an increase (`rate`,
        `increase`) rather than as a series that appears at 1. Series of members and
        backends a new config dropped stay until the process restarts (cheap, bounded)."""
        for pool in config.pools:
            for member in pool.members:
                self.held_requests.labels(self.router, pool.name, member)
                self.hold_duration_seconds.labels(self.router, pool.name, member)
                self.coalesced_total.labels(self.router, pool.name, member)
        for backend in config.backends:
            if backend.pool is not None:
                for reason in ACTIVATION_REASONS:
                    self.errors_total.labels(self.router, backend.name, "503", reason)

    def error(self, model: str, code: int, reason: str | None) -> None:
        self.errors_total.labels(self.router, model, str(code), reason or "").inc()

    def upstream_error(self, backend: str, kind: str) -> None:
        self.upstream_errors_total.labels(self.router, backend, kind).inc()
