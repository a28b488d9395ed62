"""The metrics and health server, on its own port so probes and scrapes never queue behind
a program's work: `/metrics` serves the injected registry, `/healthz` says the process
serves, `/readyz` asks the program whether it is ready.

An exposition costs CPU in proportion to the samples (some microseconds each in
prometheus-client). With `off_loop`, `/metrics` is rendered in a worker thread, one scrape
at a time, so a large registry never stalls the program's event loop for the length of a
scrape; only for registries whose collectors may be read from another thread
(prometheus-client's own metric objects lock; a collector that reads the loop's state
without a lock, as the router's does, must stay on the loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def make_health_app(registry: CollectorRegistry, ready: Callable[[], bool], *,
                    off_loop: bool = False) -> web.Application:
    one_at_a_time = asyncio.Lock()

    async def metrics(request: web.Request) -> web.Response:
        if off_loop:
            async with one_at_a_time:  # scrapes that pile up never hold more than a thread
                body = await asyncio.to_thread(generate_latest, registry)
        else:
            body = generate_latest(registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
