"""The reconciler's Prometheus metrics, on an injected registry.

Every family the reconciler exports lives on one object, built once at
the entry point on the registry the metrics server serves (tests build a fresh one), so no
collector can end up on a registry nothing exposes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence, Set
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from reconciler import swap

PREFIX = "modelpool_"

# A swap is seconds (a small model) to many minutes (a large cold load).
_SWAP_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
# A phase's, coarser: six phases of every pool would otherwise be most of its samples, and
# what a phase costs is read as a mean (`_sum` over `_count`), its buckets only roughly.
_PHASE_BUCKETS = (1, 5, 30, 120, 600)
_RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
PHASES = swap.METRIC_PHASES
# The outcomes of a member's slot saves and restores (spec.kvCache.persist).
KV_OUTCOMES = ("saved", "restored", "discarded", "failed", "timeout")
# The reasons a swap of a pool's member fails or is deferred (reconciler.swap), whose
# series each pool starts at 0.
FAILURE_REASONS = (swap.SWAP_BUDGET_EXCEEDED, swap.IDLE_PROBE_UNSUPPORTED)
DEFERRAL_REASONS = (swap.PODS_BUSY, swap.MIN_RESIDENCY, swap.IDLE_CHECK_FAILED)


class ReconcilerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._initialized: dict[tuple[str, str], tuple[str, ...]] = {}
        self.resident = Gauge(
            PREFIX + "resident",
            "1 for the member that holds its pool's slot, 0 for the other members.",
            ["namespace", "pool", "member"],
            registry=registry,
        )
        self.swaps_total = Counter(
            PREFIX + "swaps_total",
            "Completed swaps, by direction (from is empty for a cold load).",
            ["namespace", "pool", "from", "to"],
            registry=registry,
        )
        self.swap_duration_seconds = Histogram(
            PREFIX + "swap_duration_seconds",
            "Duration of a completed swap, from the request to the target being Ready.",
            ["namespace", "pool"],
            buckets=_SWAP_BUCKETS,
            registry=registry,
        )
        self.swap_phase_duration_seconds = Histogram(
            PREFIX + "swap_phase_duration_seconds",
            "Duration of each phase of a completed swap: drain, save, unload, schedule, "
            "load, restore.",
            ["namespace", "pool", "phase"],
            buckets=_PHASE_BUCKETS,
            registry=registry,
        )
        self.swap_failures_total = Counter(
            PREFIX + "swap_failures_total",
            "Swaps that did not complete, by target member and reason.",
            ["namespace", "pool", "member", "reason"],
            registry=registry,
        )
        self.idle_unloads_total = Counter(
            PREFIX + "idle_unloads_total",
            "Residents unloaded because they served nothing for spec.idleUnloadAfter.",
            ["namespace", "pool", "member"],
            registry=registry,
        )
        self.evictions_total = Counter(
            PREFIX + "evictions_total",
            "Residents of a budgeted pool unloaded to make room, by member and the member "
            "loaded for it.",
            ["namespace", "pool", "member", "for_member"],
            registry=registry,
        )
        self.swap_deferrals_total = Counter(
            PREFIX + "swap_deferrals_total",
            "Times a swap was deferred, by reason (PodsBusy, MinResidency, IdleCheckFailed).",
            ["namespace", "pool", "reason"],
            registry=registry,
        )
        self.kv_slots_total = Counter(
            PREFIX + "kv_slots_total",
            "Saves and restores of a member's slots (spec.kvCache.persist), by kind (save, "
            "restore) and outcome: saved, restored, discarded (a manifest made for another "
            "process), failed (refused or unreachable), timeout (past its cap).",
            ["namespace", "member", "kind", "outcome"],
            registry=registry,
        )
        self.reconcile_total = Counter(
            PREFIX + "reconcile_total",
            "Reconciles, by kind and result (success, error).",
            ["kind", "result"],
            registry=registry,
        )
        self.reconcile_duration_seconds = Histogram(
            PREFIX + "reconcile_duration_seconds",
            "Duration of one reconcile of one object.",
            ["kind"],
            buckets=_RECONCILE_BUCKETS,
            registry=registry,
        )
        self.api_writes_total = Counter(
            PREFIX + "reconciler_api_writes_total",
            "Writes the reconciler sent to the API server, by verb and resource.",
            ["verb", "resource"],
            registry=registry,
        )
        self.api_requests_total = Counter(
            PREFIX + "reconciler_api_requests_total",
            "Requests the reconciler sent to the API server (reads, watches and writes), by "
            "verb and resource.",
            ["verb", "resource"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            PREFIX + "reconciler_queue_depth",
            "Keys waiting in the work queue.",
            registry=registry,
        )
        self.leader = Gauge(
            PREFIX + "reconciler_leader",
            "1 while this replica holds the leader Lease.",
            registry=registry,
        )

    def pool_seen(self, namespace: str, pool: str, members: Sequence[str]) -> None:
        """Create a pool's series at 0 as soon as its members are known, so the first swap,
        failure or idle unload shows as an increase (`rate`, `increase`) rather than as a
        series that appears at 1; dropped again by `forget_pool`."""
        key = (namespace, pool)
        if self._initialized.get(key) == tuple(members):
            return
        self.forget_pool(namespace, pool, self._initialized.get(key, ()))
        self._initialized[key] = tuple(members)
        for to in members:
            for from_ in ("", *members):
                if from_ != to:
                    self.swaps_total.labels(namespace, pool, from_, to)
            for reason in FAILURE_REASONS:
                self.swap_failures_total.labels(namespace, pool, to, reason)
            self.idle_unloads_total.labels(namespace, pool, to)
        for reason in DEFERRAL_REASONS:
            self.swap_deferrals_total.labels(namespace, pool, reason)
        self.swap_duration_seconds.labels(namespace, pool)
        for phase in PHASES:
            self.swap_phase_duration_seconds.labels(namespace, pool, phase)

    def set_resident(self, namespace: str, pool: str, members: Iterable[str],
                     resident: str | Set[str] | None) -> None:
        """Each member's resident gauge: the one resident of an exclusive pool, or the set
        of a budgeted pool's."""
        residents = {resident} if isinstance(resident, str) else set(resident or ())
        for member in members:
            self.resident.labels(namespace, pool, member).set(1 if member in residents else 0)

    def swap_done(self, namespace: str, pool: str, from_: str | None, to: str, duration: float,
                  phases: Iterable[tuple[str, float]]) -> None:
        self.swaps_total.labels(namespace, pool, from_ or "", to).inc()
        self.swap_duration_seconds.labels(namespace, pool).observe(duration)
        for phase, seconds in phases:
            self.swap_phase_duration_seconds.labels(namespace, pool, phase).observe(seconds)

    def forget_pool(self, namespace: str, pool: str, members: Iterable[str]) -> None:
        """A deleted pool's members are resident nowhere: drop their series (and those of
        members it had when `pool_seen` last saw it)."""
        members = {*members, *self._initialized.pop((namespace, pool), ())}
        removals: list[tuple[Any, tuple[str, ...]]] = []
        for member in members:
            removals.append((self.resident, (namespace, pool, member)))
            removals.append((self.idle_unloads_total, (namespace, pool, member)))
            for from_ in ("", *members):
                removals.append((self.swaps_total, (namespace, pool, from_, member)))
            for reason in FAILURE_REASONS:
                removals.append((self.swap_failures_total, (namespace, pool, member, reason)))
            for other in members:
                removals.append((self.evictions_total, (namespace, pool, member, other)))
        for reason in DEFERRAL_REASONS:
            removals.append((self.swap_deferrals_total, (namespace, pool, reason)))
        removals.append((self.swap_duration_seconds, (namespace, pool)))
        for phase in PHASES:
            removals.append((self.swap_phase_duration_seconds, (namespace, pool, phase)))
        for family, labels in removals:
            with contextlib.suppress(KeyError):  # never set
                family.remove(*labels)
