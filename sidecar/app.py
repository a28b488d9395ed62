"""The OpenAI-compatible API: routes a request by its `model`, activates, forwards.

This module is the router's shell around the pure parts (routing, auth, errors): it reads
the body once, asks the activator for a target, and hands the bytes to `upstream`, the
only module that talks to model servers. The activator is reached through the
`Activation` protocol below, which `sidecar.activation.Activation` satisfies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from aiohttp import web

from sidecar import errors, fallback, upstream
from sidecar.auth import NO_KEYS, ApiKeys
from sidecar.config import BackendConfig, RouterConfig
from sidecar.errors import ProxyError
from sidecar.held_stream import HeldStream
from sidecar.metrics import RouterMetrics
from sidecar.routing import Routes, build_routes

logger = logging.getLogger(__name__)

COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# requests_total's `model` label is the backend name, so a client cannot grow it at will;
# requests that never reached a backend use these.
UNROUTED = ""
UNKNOWN_MODEL = "unknown"
# nginx's convention for a request the client abandoned.
CLIENT_CLOSED = 499
_ROUTER_KEY = frozenset({"authorization"})
_NO_HEADERS: frozenset[str] = frozenset()


class Target(Protocol):
    @property
    def base_url(self) -> str: ...

    @property
    def backend(self) -> str: ...


T = TypeVar("T", bound=Target)


class Activation(Protocol[T]):
    """The activator as the proxy uses it."""

    def acquire(self, backend: BackendConfig) -> AbstractAsyncContextManager[T]: ...

    def report_connect_failure(self, target: T) -> None: ...

    def model_states(self) -> dict[str, str]: ...

    def hold_progress(self, backend: BackendConfig) -> str: ...

    def serves_now(self, backend: BackendConfig) -> bool: ...

    def swap_can_start(self, backend: BackendConfig) -> bool: ...

    def ready(self) -> bool: ...

    def update_config(self, config: RouterConfig) -> None: ...

    async def run(self) -> None: ...

    async def shutdown(self, retry_after: float) -> None: ...


class Live:
    """What may change while the router runs: the config (and its routes) and the keys."""

    def __init__(self, config: RouterConfig, keys: ApiKeys = NO_KEYS) -> None:
        self.config = config
        self.routes: Routes = build_routes(config)
        self.keys = keys

    def apply_config(self, config: RouterConfig) -> None:
        # One assignment each: a request sees either the old pair or the new one.
        routes = build_routes(config)
        self.config, self.routes = config, routes


class Proxy:
    def __init__(
        self,
        live: Live,
        activation: Activation[Any],
        metrics: RouterMetrics,
        *,
        connect_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._live = live
        self._activation = activation
        self._metrics = metrics
        self._connect_timeout = connect_timeout
        self._clock = clock

    async def completions(self, request: web.Request) -> web.StreamResponse:
        started = self._clock()
        label = UNROUTED
        held: HeldStream | None = None
        try:
            self._authorize(request)
            live = self._live
            body = await _read_body(request, live.config.max_body_bytes)
            model, streamed = _model_of(body)
            backend = live.routes.resolve(model)
            if backend is None:
                label = UNKNOWN_MODEL
                raise errors.model_not_found(model)
            backend, rewrite = fallback.choose(backend, live.config,
                                               self._activation.serves_now,
                                               self._activation.swap_can_start)
            if rewrite is not None:
                body = fallback.with_model(body, rewrite)
            label = backend.name
            if streamed:
                held = HeldStream(request, backend.name,
                                  live.config.held_stream_keepalive_seconds,
                                  functools.partial(self._activation.hold_progress, backend),
                                  as_content=live.config.held_stream_progress == "content")
            relay = await self._dispatch(request, backend, body, started, held)
        except asyncio.CancelledError:
            # The client went away (the server cancels its handler): a held request
            # leaves its place in the queue by this cancellation.
            self._metrics.request_done(label, CLIENT_CLOSED, self._clock() - started)
            raise
        except ProxyError as err:
            if held is not None and held.started:  # its 200 went out: the error is an event
                response = await held.error(errors.error_body(err))
            else:
                response = errors.error_response(err)
            self._metrics.request_done(label, err.status, self._clock() - started)
            self._metrics.error(label, err.status, err.code)
            return response
        if relay.upstream_failure is not None:
            self._metrics.upstream_error(label, relay.upstream_failure)
        code = CLIENT_CLOSED if relay.client_gone else relay.answered or relay.response.status
        self._metrics.request_done(label, code, self._clock() - started)
        return relay.response

    async def _dispatch(
        self,
        request: web.Request,
        backend: BackendConfig,
        body: bytes,
        started: float,
        held: HeldStream | None = None,
    ) -> upstream.Relay:
        live = self._live
        headers = upstream.request_headers(
            request.headers,
            # The router's own key is not the upstream's business.
            drop=_ROUTER_KEY if live.keys.enabled else _NO_HEADERS,
        )

        def first_chunk() -> None:
            self._metrics.first_byte(backend.name, self._clock() - started)

        slots, client = request.app[upstream.SLOTS], request.app[upstream.CLIENT]
        read_timeout = live.config.response_header_timeout_seconds

        # A request that never reached a live server (the endpoint refused the connection,
        # or died with it half-open) is re-verified and dispatched once more through the
        # activator, which holds it until the member is ready again: the client sees no
        # 502 for a resident whose process went away.
        for attempt in (1, 2):
            try:
                async with contextlib.AsyncExitStack() as stack:
                    entering = stack.enter_async_context(self._activation.acquire(backend))
                    target = await (held.hold(entering) if held is not None else entering)
                    endpoint = target.base_url
                    try:
                        await slots.acquire(endpoint)
                        try:
                            return await upstream.forward(
                                request,
                                client,
                                base_url=endpoint,
                                body=body,
                                headers=headers,
                                # Starts once the request is sent, with the member
                                # resident: a hold never eats into it.
                                read_timeout=read_timeout,
                                on_first_chunk=first_chunk,
                                started=held.response if held is not None else None,
                                answered_by=backend.name,
                            )
                        finally:
                            slots.release(endpoint)
                    except Exception as e:
                        err = errors.translate(e, backend.name)
                        if err.kind is None:
                            raise
                        self._metrics.upstream_error(backend.name, err.kind)
                        dead = errors.is_connect_failure(err) or (
                            err.kind == "disconnect"
                            and not await upstream.reachable(
                                target.base_url, self._connect_timeout
                            )
                        )
                        if dead:
                            self._activation.report_connect_failure(target)
                        logger.warning(
                            "backend %s at %s: %s%s",
                            backend.name,
                            target.base_url,
                            err.message,
                            "; dispatching again"
                            if dead and attempt == 1 and backend.service is not None
                            else "",
                        )
                        if dead and attempt == 1 and backend.service is not None:
                            continue
                        raise err from e
            except ProxyError:
                raise
            except Exception as e:
                err = errors.translate(e, backend.name)
                if err.status == 500:
                    logger.exception("request for backend %s failed", backend.name)
                raise err from e
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def models(self, request: web.Request) -> web.Response:
        try:
            self._authorize(request)
        except ProxyError as err:
            return errors.error_response(err)
        states = self._activation.model_states()
        data = [_model_entry(name, b, states) for name, b in self._live.routes.names()]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        """One model by id or alias, as the SDK's `models.retrieve` asks for it."""
        try:
            self._authorize(request)
            name = request.match_info["model"]
            backend = self._live.routes.by_name.get(name)
            if backend is None:
                raise errors.model_not_found(name)
        except ProxyError as err:
            return errors.error_response(err)
        return web.json_response(_model_entry(name, backend, self._activation.model_states()))

    def _authorize(self, request: web.Request) -> None:
        if not self._live.keys.allows(request.headers.get("Authorization")):
            raise errors.unauthorized()


def _model_entry(name: str, backend: BackendConfig, states: dict[str, str]) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "modelpool",
        "backend": backend.name,
        "state": states.get(backend.name, "unavailable"),
    }


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, read once, refused past `limit` bytes without reading the rest."""
    length = request.content_length
    if length is not None:
        if length > limit:
            raise errors.body_too_large(limit)
        try:
            return await request.content.readexactly(length)
        except asyncio.IncompleteReadError as e:
            raise errors.bad_request("Request body ended before its Content-Length.") from e
    chunks = bytearray()
    async for chunk in request.content.iter_any():
        chunks += chunk
        if len(chunks) > limit:
            raise errors.body_too_large(limit)
    return bytes(chunks)


def _model_of(body: bytes) -> tuple[str, bool]:
    """The request's `model`, and whether it asks for a stream."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.bad_request(f"Request body is not valid JSON: {e}") from e
    if not isinstance(payload, dict):
        raise errors.bad_request("Request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise errors.bad_request("Request body needs a string 'model' field.", param="model")
    return model, payload.get("stream") is True


PROXY = web.AppKey("proxy", Proxy)


def make_app(
    live: Live,
    activation: Activation[Any],
    metrics: RouterMetrics,
    *,
    connect_timeout: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """The API application; its upstream session lives and dies with it."""
    proxy = Proxy(live, activation, metrics, connect_timeout=connect_timeout, clock=clock)
    app = web.Application()
    app[PROXY] = proxy
    app.cleanup_ctx.append(upstream.client_context(connect_timeout))
    for path in COMPLETION_PATHS:
        app.router.add_post(path, proxy.completions)
    app.router.add_get("/v1/models", proxy.models)
    app.router.add_get("/v1/models/{model}", proxy.model)
    return app
