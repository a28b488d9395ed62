"""Micro-benchmark, no cluster: one scrape of the reconciler's `/metrics` at N pools.

The reconciler's own metrics (`reconciler.metrics.ReconcilerMetrics`) on a fresh registry,
filled as N pools of 3 members each leave them: every pool seen (its series at 0), its
resident set, swaps with their phases (save and restore on the pools that persist their KV
cache, every fifth), a failure, a deferral and an idle unload, evictions on the budgeted
pools (every tenth), and the per-kind reconcile and API request series; without the
`_created` series, as the reconciler's process exports them. Per pool count it prints the
samples (and per pool), the body's size, the CPU of one exposition (`generate_latest`, the
least of `--repeat`), and one GET of `/metrics` from the metrics server
(`telemetry.health`) set up as the reconciler sets it up, in this process: its wall time
and the longest the event loop went without running a 1 ms ticker meanwhile (the time
every reconcile, watch and Lease renewal waits behind a scrape).

    .venv/bin/python benchmarks/bench_metrics_scrape.py --pools 10,100,500 [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import socket
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from reconciler.metrics import (  # noqa: E402
    DEFERRAL_REASONS,
    FAILURE_REASONS,
    PHASES,
    ReconcilerMetrics,
)
from telemetry.health import make_health_app  # noqa: E402

NAMESPACE = "models"
MEMBERS = 3
KINDS = ("ModelPool", "ModelServer", "ModelRouter")
VERBS = ("get", "list", "watch", "patch", "apply", "create")
RESOURCES = ("modelpools", "modelservers", "modelrouters", "deployments", "services", "pods",
             "events", "leases")


def fill(metrics: ReconcilerMetrics, pools: int) -> None:
    """The series N pools leave behind after a few swaps each."""
    for kind in KINDS:
        for result in ("success", "error"):
            metrics.reconcile_total.labels(kind, result).inc()
        metrics.reconcile_duration_seconds.labels(kind).observe(0.02)
    for verb in VERBS:
        for resource in RESOURCES:
            metrics.api_requests_total.labels(verb, resource).inc()
            metrics.api_writes_total.labels(verb, resource).inc()
    metrics.queue_depth.set(0)
    metrics.leader.set(1)
    for p in range(pools):
        pool = f"pool-{p:04d}"
        members = [f"{pool}-m{i}" for i in range(MEMBERS)]
        metrics.pool_seen(NAMESPACE, pool, members)
        persist = p % 5 == 0
        budgeted = p % 10 == 0
        phases = [phase for phase in PHASES if persist or phase not in ("save", "restore")]
        previous: str | None = None
        for i, to in enumerate(members + members[:1]):
            metrics.swap_done(NAMESPACE, pool, previous, to, 2.0 + i,
                              [(phase, 0.1 * (j + 1)) for j, phase in enumerate(phases)])
            previous = to
        metrics.set_resident(NAMESPACE, pool, members, {members[0], members[1]} if budgeted
                             else members[0])
        metrics.swap_failures_total.labels(NAMESPACE, pool, members[1], FAILURE_REASONS[0]).inc()
        metrics.swap_deferrals_total.labels(NAMESPACE, pool, DEFERRAL_REASONS[0]).inc()
        metrics.idle_unloads_total.labels(NAMESPACE, pool, members[2]).inc()
        if budgeted:
            metrics.evictions_total.labels(NAMESPACE, pool, members[2], members[0]).inc()
        if persist:
            for member in members:
                metrics.kv_slots_total.labels(NAMESPACE, member, "save", "saved").inc()
                metrics.kv_slots_total.labels(NAMESPACE, member, "restore", "restored").inc()


def samples_in(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def exposition_cpu(registry: CollectorRegistry, repeat: int) -> tuple[float, bytes]:
    """The least CPU seconds of one `generate_latest` over `repeat` runs, and its body."""
    best, body = float("inf"), b""
    for _ in range(repeat):
        started = time.process_time()
        body = generate_latest(registry)
        best = min(best, time.process_time() - started)
    return best, body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def served_scrape(registry: CollectorRegistry) -> tuple[float, float]:
    """One GET of /metrics from the metrics server on this loop: its wall seconds, and the
    longest the loop went without running a ticker that asks for 1 ms sleeps meanwhile."""
    runner = web.AppRunner(make_health_app(registry, lambda: True, off_loop=True), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    longest = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()  # a first scrape, not measured
            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0.01)
            started = time.perf_counter()
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()
            wall = time.perf_counter() - started
            done.set()
            await tick
    finally:
        await runner.cleanup()
    return wall, longest


def profile(registry: CollectorRegistry, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    generate_latest(registry)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default="10,100,500",
                        help="comma-separated pool counts (3 members each)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="expositions per pool count; the least CPU is shown")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of one exposition at the largest pool count")
    args = parser.parse_args()
    counts = [int(n) for n in args.pools.split(",")]
    disable_created_metrics()  # as `python -m reconciler` does
    print("| pools | samples | per pool | body | exposition CPU | GET /metrics wall "
          "| longest loop stall |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    registry = CollectorRegistry()
    for pools in counts:
        registry = CollectorRegistry()
        fill(ReconcilerMetrics(registry), pools)
        cpu, body = exposition_cpu(registry, args.repeat)
        wall, stall = asyncio.run(served_scrape(registry))
        samples = samples_in(body)
        print(f"| {pools} | {samples:,} | {samples / pools:.0f} | {len(body) / 1e6:.1f} MB "
              f"| {cpu * 1000:.0f} ms | {wall * 1000:.0f} ms | {stall * 1000:.0f} ms |",
              flush=True)
    if args.profile:
        print(f"\none exposition at {counts[-1]} pools, by own time:\n")
        print(profile(registry, 15))


if __name__ == "__main__":
    main()
