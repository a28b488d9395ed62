"""Entry point of the reconciler: `python -m reconciler` / `modelpool-reconciler`.

`run` builds the settings from flags and environment, then supervises under one
TaskGroup the watches, the work-queue workers (only while this replica leads), the Lease
and the metrics and health server; any of them ending unexpectedly takes the process
down. SIGTERM stops the workers, releases the Lease and exits 0. `render FILES...` prints
what the reconciler would apply, through the same renderer (reconciler.render_cli).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp
import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics

from reconciler import device_claim
from reconciler.controller import Controller
from reconciler.kube import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES, Kube
from reconciler.kv_slots_io import SlotFiles
from reconciler.leader import LeaderElector
from reconciler.logs import setup_logging
from reconciler.metrics import ReconcilerMetrics
from reconciler.probes import HttpIdleProbe
from reconciler.render import Renderer
from reconciler.settings import Settings, add_run_arguments, from_args
from telemetry.health import make_health_app

log = logging.getLogger("reconciler")


# Seconds between attempts to reach the API server at start.
_CONNECT_BACKOFF = (0.5, 1.0, 2.0, 5.0)


class Stopped(Exception):
    """SIGTERM or SIGINT: leave the TaskGroup."""


async def _supervised(name: str, work: Coroutine[Any, Any, None]) -> None:
    await work
    raise RuntimeError(f"{name} stopped unexpectedly")


async def _connect(kubeconfig: str | None, stop: asyncio.Event) -> Kube | None:
    """A client once the API server answers (None if stopped first): a reconciler started
    before its API server is reachable waits for it, serving /healthz meanwhile, instead
    of crash-looping."""
    for attempt in itertools.count():
        try:
            return await Kube.connect(kubeconfig)
        except httpx.TransportError as e:
            delay = _CONNECT_BACKOFF[min(attempt, len(_CONNECT_BACKOFF) - 1)]
            log.warning("API server not reachable (%s: %s); trying again in %gs",
                        type(e).__name__, e, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
            return None
    raise AssertionError("unreachable")


async def run(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
) -> None:
    """The reconciler until `stop` is set, or SIGTERM/SIGINT when `handle_signals`
    (tests running it in-process leave the signals to pytest)."""
    registry = registry or CollectorRegistry()
    metrics = ReconcilerMetrics(registry)
    stop = stop or asyncio.Event()
    if handle_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    # Ready once the caches are synced: a standby waiting for the Lease is ready too (it
    # is healthy and takes over the moment it leads). Served from the start, so the
    # metrics and health answer while the API server is still out of reach. Its metrics
    # are prometheus-client's own objects, safe to read from a thread: at hundreds of pools
    # an exposition takes a sizeable fraction of a second, which the reconciles, watches
    # and the Lease's renewals must not wait behind.
    synced = asyncio.Event()
    runner = web.AppRunner(make_health_app(registry, synced.is_set, off_loop=True),
                           access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.bind_host, settings.metrics_port)
        await site.start()
        log.info("metrics and health on %s:%d", settings.bind_host, settings.metrics_port)
        kube = await _connect(settings.kubeconfig, stop)
        if kube is None:
            log.info("stopping before the API server answered")
            return
        try:
            await _reconcile(settings, kube, metrics, stop, synced)
        finally:
            await kube.close()
    finally:
        await runner.cleanup()


async def _reconcile(settings: Settings, kube: Kube, metrics: ReconcilerMetrics,
                     stop: asyncio.Event, synced: asyncio.Event) -> None:
    kube.on_request = lambda verb, resource: metrics.api_requests_total.labels(
        verb, resource).inc()
    elector = LeaderElector(kube, settings.leader) if settings.leader.enabled else None
    claims_served = device_claim.claims_served(
        await kube.discover(device_claim.GROUP_VERSION))
    # Watched only if this reconciler may: a watch it is refused would keep the caches
    # from ever syncing, and every pool waiting.
    claims_refused = None
    if claims_served:
        for resource, namespace in ((RESOURCE_CLAIMS, settings.namespace),
                                    (RESOURCE_SLICES, None), (DEVICE_CLASSES, None)):
            claims_refused = claims_refused or await kube.list_refused(resource, namespace)
    log.info("Dynamic Resource Allocation (%s): %s", device_claim.GROUP_VERSION,
             "not served, claim pools are stalled" if not claims_served
             else f"refused ({claims_refused}), claim pools are stalled" if claims_refused
             else "served")
    async with aiohttp.ClientSession() as session:
        probe = HttpIdleProbe(session, settings.swap.probe_timeout_seconds)
        controller = Controller(kube, settings, metrics,
                                Renderer(reconciler_namespace=settings.leader.namespace,
                                         router_image=settings.router_image),
                                probe, ready=synced,
                                claims_served=claims_served and claims_refused is None,
                                claims_refused=claims_refused,
                                slot_files=SlotFiles(session,
                                                     settings.swap.probe_timeout_seconds))

        async def lead() -> None:
            if elector is not None:
                await elector.acquire()
            metrics.leader.set(1)
            async with asyncio.TaskGroup() as tg:
                if elector is not None:
                    tg.create_task(_supervised("lease", elector.hold()))
                tg.create_task(_supervised("workers", controller.run_workers()))

        async def wait_stop() -> None:
            await stop.wait()
            raise Stopped

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_supervised("watches", controller.run_informers()), name="watches")
                tg.create_task(_supervised("leader", lead()), name="leader")
                tg.create_task(wait_stop(), name="stop")
        except* Stopped:
            log.info("stopping")
        finally:
            controller.queue.shutdown()
            metrics.leader.set(0)
            if elector is not None:
                await elector.release()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "render":
        from reconciler.render_cli import main as render_main

        return render_main(argv[1:])
    parser = argparse.ArgumentParser(prog="modelpool-reconciler")
    sub = parser.add_subparsers(dest="command")
    run_parser = sub.add_parser("run", help="reconcile (the default)")
    add_run_arguments(run_parser)
    sub.add_parser("render", help="print what would be applied: render FILES...")
    if not argv or argv[0].startswith("-"):
        argv = ["run", *argv]
    args = parser.parse_args(argv)
    settings = from_args(args, os.environ)
    setup_logging(settings.log_level)
    # Process-wide in prometheus-client: no `_created` series beside every counter and
    # histogram (28 of the samples of a pool of 3 members), which nothing reads.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        asyncio.run(run(settings))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
