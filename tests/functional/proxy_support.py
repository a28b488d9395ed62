"""What the router's functional tests share: a fake upstream they control request by
request, a url-only stand-in for the activator, and a runner for a real router process.

The stand-in holds requests for pooled backends until released or shut down, so held
requests can be observed without a cluster; everything else dispatches to the backend's
`url` at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sidecar import dialects
from sidecar.app import Api
from sidecar.config import BackendConfig, RouterConfig
from sidecar.http import server as http_server
from sidecar.metrics import RouterMetrics
from sidecar.target import ActivationError

# --- fake upstream ------------------------------------------------------------------------

# Hop-by-hop headers the fake upstream sends; the router must drop every one of them.
UPSTREAM_HOP_HEADERS = {
    "Keep-Alive": "timeout=5",
    "Proxy-Authenticate": "Basic",
    "X-Hop": "listed in Connection",
}


@dataclass
class FakeUpstream:
    """Answers from instructions in the request body: `x_sleep` before the headers,
    `x_status`, `x_chunks` streamed `x_interval` seconds apart (or, with
    `x_until_released`, until the test sets `release`), `x_break` to cut the connection
    mid-stream, `x_end_when_released` to hold the end of the body after `data: [DONE]`
    until the test sets `release`. Every answer echoes the headers and body it received."""

    received: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            app.router.add_post(path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.received.append({"path": request.path_qs, "headers": dict(request.headers)})
        await asyncio.sleep(float(body.get("x_sleep", 0)))
        headers = {"X-Upstream": "yes", "Connection": "keep-alive, X-Hop", **UPSTREAM_HOP_HEADERS}
        echo = {
            "path": request.path_qs,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": raw.decode(),
        }
        until_released = bool(body.get("x_until_released"))
        chunks = 1_000_000 if until_released else int(body.get("x_chunks", 0))
        if not chunks:
            return web.json_response(echo, status=int(body.get("x_status", 200)), headers=headers)
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        interval = float(body.get("x_interval", 0.1))
        for i in range(chunks):
            if until_released and self.release.is_set():
                break
            if i:
                await asyncio.sleep(interval)
            if body.get("x_break") == i and request.transport is not None:
                request.transport.abort()
                return response
            await response.write(f"data: {json.dumps({'i': i})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        if body.get("x_end_when_released"):
            await self.release.wait()
        await response.write_eof()
        return response


@asynccontextmanager
async def serve_app(app: web.Application | Api, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve `app` on a free loopback port; yields its base URL. The router's API is
    served by its own server, as `python -m sidecar` serves it; a fake upstream by aiohttp."""
    if isinstance(app, Api):
        server = http_server.Server(app, max_body=app.max_body, errors=dialects.SERVER_ERRORS)
        await server.start(host, 0)
        try:
            yield f"http://{host}:{server.port}"
        finally:
            await server.shutdown(0)
            app.close()
        return
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    listening = site._server
    assert listening is not None
    port = listening.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


# --- stand-in activator -------------------------------------------------------------------


@dataclass(frozen=True)
class UrlTarget:
    base_url: str
    backend: str
    pool: str | None


REFUSED_BACKEND = "refused"


class StandInActivation:
    """Dispatches to `backend.url`. Pooled backends are held until `release()`; the
    backend named `refused` is always refused with a Retry-After of 2.3 s."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.connect_failures: list[UrlTarget] = []
        self.configs: list[RouterConfig] = [config]
        self.held = 0
        self.progress_asked = 0  # once per keep-alive comment of a held stream
        self.incumbent_idle = True  # what swap_can_start answers (activation IfIdle)
        self._released = asyncio.Event()
        self._shutdown_retry: float | None = None
        self._stopped = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    @asynccontextmanager
    async def acquire(self, backend: BackendConfig) -> AsyncIterator[UrlTarget]:
        if backend.name == REFUSED_BACKEND:
            raise ActivationError(
                "swap budget exceeded for the test", code="swap_budget_exceeded", retry_after=2.3
            )
        if self._shutdown_retry is not None:
            raise ActivationError(
                "router is shutting down", code="shutting_down", retry_after=self._shutdown_retry
            )
        if backend.pool is not None:
            gauge = self.metrics.held(backend.pool, backend.name)
            self.held += 1
            gauge.inc()
            try:
                await _first(self._released.wait(), self._stopped.wait())
            finally:
                self.held -= 1
                gauge.dec()
            if self._shutdown_retry is not None:
                raise ActivationError(
                    "router is shutting down",
                    code="shutting_down",
                    retry_after=self._shutdown_retry,
                )
        assert backend.url is not None
        yield UrlTarget(backend.url, backend.name, backend.pool)

    def report_connect_failure(self, target: UrlTarget) -> None:
        self.connect_failures.append(target)

    def model_states(self) -> dict[str, str]:
        return {b.name: ("stopped" if b.pool else "ready") for b in self.config.backends}

    def serves_now(self, backend: BackendConfig) -> bool:
        return backend.pool is None or self._released.is_set()

    def swap_can_start(self, backend: BackendConfig) -> bool:
        return self.incumbent_idle

    def hold_progress(self, backend: BackendConfig) -> str:
        self.progress_asked += 1
        return "held until release()" if backend.pool is not None else "not held"

    def ready(self) -> bool:
        return True

    def update_config(self, config: RouterConfig) -> None:
        self.config = config
        self.configs.append(config)

    async def run(self) -> None:
        await self._stopped.wait()

    async def shutdown(self, retry_after: float) -> None:
        self._shutdown_retry = retry_after
        self._stopped.set()


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


# --- configs ------------------------------------------------------------------------------


def config_json(backends: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "version": 1,
        "router": {"namespace": "test", "name": "chat"},
        "routeStrategy": "BackendNameMatch",
        "defaultRoute": None,
        "responseHeaderTimeoutSeconds": 30,
        "maxHeldRequests": 100,
        "maxBodyBytes": 4096,
        "backends": backends,
        "pools": [],
    }
    raw.update(overrides)
    return raw


def url_backend(name: str, url: str, *aliases: str, pool: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "aliases": list(aliases),
        "modelServer": None,
        "service": None,
        "port": None,
        "pool": pool,
        "url": url,
    }


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Until `condition()` (a count of the stand-in's: there is no event to wait on)."""
    async with asyncio.timeout(limit):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)

