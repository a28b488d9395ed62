"""The router's Prometheus metrics, on an injected registry.

One object holds every router family so that the activator, the proxy and the health
server share the same collectors, and tests can assert on a fresh registry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

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
        # The three series every proxied request touches, kept by `_RequestSeries`.
        self._per_request = _RequestSeries(router)
        registry.register(self._per_request)
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

    def request_done(self, model: str, code: int, seconds: float, api: str = "other") -> None:
        """One request answered: `api` is its `sidecar.apis` label (a closed set)."""
        self._per_request.request_done(model, code, seconds, api)

    def first_byte(self, model: str, seconds: float) -> None:
        self._per_request.first_byte(model, seconds)

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


class _Buckets:
    """One histogram series: a count per bucket (not yet cumulative) and the sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0


class _RequestSeries(Collector):
    """`requests_total`, `request_duration_seconds` and `time_to_first_byte_seconds`.

    Every proxied request adds to all three, so they are kept here as plain numbers and
    exported when scraped, rather than through prometheus-client's metric objects, whose
    every increment takes a lock (five a request) and checks its labels: 5 us a request
    when the router spent 141 us on one (docs/benchmarks.md). The router updates them only
    from its event loop, and its metrics are served from the same loop, so no lock is
    needed. The exposition is prometheus-client's, as for every other family (without the
    `_created` series, which nothing reads).
    """

    def __init__(self, router: str) -> None:
        self._router = router
        self._requests: dict[tuple[str, int, str], int] = {}
        self._durations: dict[str, _Buckets] = {}
        self._ttfb: dict[str, _Buckets] = {}

    def request_done(self, model: str, code: int, seconds: float, api: str) -> None:
        key = (model, code, api)
        self._requests[key] = self._requests.get(key, 0) + 1
        _observe(self._durations, _REQUEST_BUCKETS, model, seconds)

    def first_byte(self, model: str, seconds: float) -> None:
        _observe(self._ttfb, _TTFB_BUCKETS, model, seconds)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            PREFIX + "requests_total",
            "Requests answered by the router, by requested model, HTTP status code and API "
            "(chat, completions, embeddings, responses, messages, rerank, audio, tokenize, "
            "upstream, other).",
            labels=["router", "model", "code", "api"],
        )
        for (model, code, api), count in self._requests.items():
            requests.add_metric([self._router, model, str(code), api], count)
        yield requests
        yield self._histogram(
            "request_duration_seconds",
            "Time from receiving a request to the end of its response.",
            _REQUEST_BUCKETS, self._durations)
        yield self._histogram(
            "time_to_first_byte_seconds",
            "Time from receiving a request to sending the first byte of its response body.",
            _TTFB_BUCKETS, self._ttfb)

    def _histogram(self, name: str, documentation: str, bounds: Sequence[float],
                   series: dict[str, _Buckets]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(PREFIX + name, documentation, labels=["router", "model"])
        edges = [repr(float(b)) for b in bounds] + ["+Inf"]  # as prometheus-client writes `le`
        for model, buckets in series.items():
            total, cumulative = 0, []
            for edge, count in zip(edges, buckets.counts, strict=True):
                total += count
                cumulative.append((edge, total))
            family.add_metric([self._router, model], cumulative, buckets.sum)
        return family


def _observe(series: dict[str, _Buckets], bounds: tuple[float, ...], model: str,
             seconds: float) -> None:
    buckets = series.get(model)
    if buckets is None:
        buckets = series[model] = _Buckets(len(bounds) + 1)
    # The first bound at or above `seconds`: buckets are "less than or equal" (`le`).
    buckets.counts[bisect_left(bounds, seconds)] += 1
    buckets.sum += seconds
