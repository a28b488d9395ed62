"""The OpenAI-compatible API: routes a request by its `model`, activates, forwards.

This module is the router's shell around the pure parts (routing, auth, errors): it takes
the body the server read (`sidecar.http.server`), asks the activator for a target, and
hands the bytes to `sidecar.relay`, which sends them through the HTTP client
(`sidecar.http.client`, the only module that talks to model servers). The activator is
reached through the `Activation` protocol below, which `sidecar.activation.Activation`
satisfies.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from sidecar import dead_endpoint, errors, fallback
from sidecar.auth import NO_KEYS, ApiKeys
from sidecar.config import BackendConfig, RouterConfig
from sidecar.errors import ProxyError
from sidecar.held_stream import HeldStream, upstream_error_event
from sidecar.http.client import Client
from sidecar.http.headers import request_headers
from sidecar.http.messages import Reply, Request
from sidecar.http.slots import MAX_IN_FLIGHT_PER_ENDPOINT, EndpointSlots
from sidecar.metrics import RouterMetrics
from sidecar.relay import Relay, forward
from sidecar.routing import Routes, build_routes

logger = logging.getLogger(__name__)

COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# requests_total's `model` label is the backend name, so a client cannot grow it at will;
# requests that never reached a backend use these.
UNROUTED = ""
UNKNOWN_MODEL = "unknown"
# nginx's convention for a request the client abandoned.
CLIENT_CLOSED = 499
_ROUTER_KEY = frozenset({b"authorization"})
_NO_HEADERS: frozenset[bytes] = frozenset()


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
        self.client = Client(connect_timeout)
        self._slots = EndpointSlots(MAX_IN_FLIGHT_PER_ENDPOINT)

    async def completions(self, request: Request, reply: Reply) -> None:
        started = self._clock()
        label = UNROUTED
        held: HeldStream | None = None
        try:
            self._authorize(request)
            live = self._live
            body = request.body
            model, streamed = _model_of(body)
            backend = live.routes.resolve(model)
            if backend is None:
                label = UNKNOWN_MODEL
                raise errors.model_not_found(model)
            if backend.fallback is not None:
                backend, rewrite = fallback.choose(backend, live.config,
                                                   self._activation.serves_now,
                                                   self._activation.swap_can_start)
                if rewrite is not None:
                    body = fallback.with_model(body, rewrite)
            label = backend.name
            if streamed:
                held = HeldStream(request, reply, backend.name,
                                  live.config.held_stream_keepalive_seconds,
                                  functools.partial(self._activation.hold_progress, backend),
                                  as_content=live.config.held_stream_progress == "content")
            relay = await self._dispatch(request, reply, backend, body, started, held)
        except asyncio.CancelledError:
            # The client went away (the server cancels its handler): a held request
            # leaves its place in the queue by this cancellation.
            code = reply.status if _delivered(reply) else CLIENT_CLOSED
            self._metrics.request_done(label, code, self._clock() - started)
            raise
        except ProxyError as err:
            self._metrics.request_done(label, err.status, self._clock() - started)
            self._metrics.error(label, err.status, err.code)
            if held is not None and held.started:  # its 200 went out: the error is an event
                await held.error(errors.error_body(err))
            else:
                await reply.send(*errors.answer(err))
            return
        if relay.upstream_failure is not None:
            self._metrics.upstream_error(label, relay.upstream_failure)
        gone = relay.client_gone and not _delivered(reply)
        code = CLIENT_CLOSED if gone else relay.answered or relay.status
        self._metrics.request_done(label, code, self._clock() - started)

    async def _dispatch(
        self,
        request: Request,
        reply: Reply,
        backend: BackendConfig,
        body: bytes,
        started: float,
        held: HeldStream | None = None,
    ) -> Relay:
        live = self._live
        headers = request_headers(
            request.raw_headers,
            # The router's own key is not the upstream's business.
            drop=_ROUTER_KEY if live.keys.enabled else _NO_HEADERS,
        )

        def first_chunk() -> None:
            self._metrics.first_byte(backend.name, self._clock() - started)

        slots, client = self._slots, self.client
        read_timeout = live.config.response_header_timeout_seconds

        # A request whose endpoint turns out dead (`sidecar.dead_endpoint`) goes once more
        # through the activator, which holds it until the member is ready again.
        for attempt in (1, 2):
            try:
                lease = self._activation.acquire(backend)
                # Entered through `held` for a stream, which keeps the client's stream alive
                # while the request is held; left below once the answer is done.
                target = await (held.hold(lease) if held is not None else lease.__aenter__())
            except ProxyError:
                raise
            except Exception as e:
                raise _failure(e, backend.name) from e
            endpoint = target.base_url
            try:
                if not slots.take(endpoint):
                    await slots.acquire(endpoint)
                try:
                    return await forward(
                        request,
                        reply,
                        client,
                        base_url=endpoint,
                        body=body,
                        headers=headers,
                        # Starts once the request is sent, with the member resident: a
                        # hold never eats into it.
                        read_timeout=read_timeout,
                        on_first_chunk=first_chunk,
                        error_event=upstream_error_event,
                        answered_by=backend.name,
                    )
                finally:
                    slots.release(endpoint)
            except Exception as e:
                err = _failure(e, backend.name)
                if err.kind is not None and await self._again(err, target, backend, attempt):
                    continue
                raise err from e
            finally:
                await lease.__aexit__(None, None, None)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _again(
        self, err: ProxyError, target: Target, backend: BackendConfig, attempt: int
    ) -> bool:
        """After the upstream failure `err`: count it, tell the activation if the endpoint
        is dead, and say whether the request is dispatched once more."""
        assert err.kind is not None
        self._metrics.upstream_error(backend.name, err.kind)
        dead = await dead_endpoint.is_dead(err, target.base_url, self._connect_timeout)
        if dead:
            self._activation.report_connect_failure(target)
        again = dead and attempt == 1 and backend.service is not None
        logger.warning(
            "backend %s at %s: %s%s",
            backend.name,
            target.base_url,
            err.message,
            "; dispatching again" if again else "",
        )
        return again

    async def models(self, request: Request, reply: Reply) -> None:
        try:
            self._authorize(request)
        except ProxyError as err:
            await reply.send(*errors.answer(err))
            return
        states = self._activation.model_states()
        data = [_model_entry(name, b, states) for name, b in self._live.routes.names()]
        await reply.send(200, _JSON, json.dumps({"object": "list", "data": data}).encode())

    async def model(self, request: Request, reply: Reply, name: str) -> None:
        """One model by id or alias, as the SDK's `models.retrieve` asks for it."""
        try:
            self._authorize(request)
            backend = self._live.routes.by_name.get(name)
            if backend is None:
                raise errors.model_not_found(name)
        except ProxyError as err:
            await reply.send(*errors.answer(err))
            return
        entry = _model_entry(name, backend, self._activation.model_states())
        await reply.send(200, _JSON, json.dumps(entry).encode())

    def _authorize(self, request: Request) -> None:
        keys = self._live.keys
        if keys.enabled and not keys.allows(request.header(b"authorization")):
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


# json's C scanner: one JSON value from a position in a str. `json.loads` reaches the same
# scanner through its encoding detection (Python code) and two whitespace matches. The
# attribute is set in `JSONDecoder.__init__`, which typeshed does not list.
_scan_value: Callable[[str, int], tuple[Any, int]] = (
    json.JSONDecoder().scan_once  # type: ignore[attr-defined]
)


def parse_json(body: bytes) -> Any:
    """`json.loads(body)`, by the C scanner alone for a UTF-8 body (RFC 8259 requires it)
    that is one value with nothing around it, as clients send. Any other body (a BOM,
    whitespace around the value, UTF-16, invalid JSON) takes `json.loads` itself, so the
    result and the error are always `json.loads`'s."""
    try:
        text = body.decode()
        value, end = _scan_value(text, 0)
    except (StopIteration, ValueError):  # UnicodeDecodeError is a ValueError
        return json.loads(body)
    if end != len(text):
        return json.loads(body)
    return value


# The last event of an OpenAI stream. openai-python's Stream closes the connection as soon
# as it reads it, without waiting for the end of the chunked body.
_STREAM_END = b"data: [DONE]"


def _delivered(reply: Reply) -> bool:
    """Whether a client that left had the whole answer: the stream's last event went out,
    and only the body's framing was left to write. Such a request is answered, not 499."""
    return reply.status == 200 and reply.tail.rstrip().endswith(_STREAM_END)


def _model_of(body: bytes) -> tuple[str, bool]:
    """The request's `model`, and whether it asks for a stream."""
    try:
        payload = parse_json(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.bad_request(f"Request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise errors.bad_request("Request body nests arrays or objects too deeply.") from e
    if not isinstance(payload, dict):
        raise errors.bad_request("Request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise errors.bad_request("Request body needs a string 'model' field.", param="model")
    return model, payload.get("stream") is True


def _failure(e: Exception, backend: str) -> ProxyError:
    """What the client is told of `e`; a failure of the router itself is logged."""
    err = errors.translate(e, backend)
    if err.status == 500:
        logger.exception("request for backend %s failed", backend)
    return err


_JSON = (("Content-Type", "application/json"),)
_MODELS = "/v1/models"


class Api:
    """The API port's routes: the request handler of `sidecar.http.server.Server`."""

    def __init__(self, proxy: Proxy, live: Live) -> None:
        self.proxy = proxy
        self._live = live

    @property
    def client(self) -> Client:
        return self.proxy.client

    def max_body(self) -> int:
        return self._live.config.max_body_bytes

    async def __call__(self, request: Request, reply: Reply) -> None:
        path, method = request.path, request.method
        if path in COMPLETION_PATHS:
            if method == "POST":
                await self.proxy.completions(request, reply)
                return
            allowed = "POST"
        elif path == _MODELS or path.startswith(_MODELS + "/"):
            if method == "GET":
                if path == _MODELS:
                    await self.proxy.models(request, reply)
                else:
                    name = urllib.parse.unquote(path[len(_MODELS) + 1:])
                    await self.proxy.model(request, reply, name)
                return
            allowed = "GET"
        else:
            await reply.send(*errors.answer(errors.not_found(path)))
            return
        status, headers, body = errors.answer(errors.method_not_allowed(method, path))
        await reply.send(status, [*headers, ("Allow", allowed)], body)

    def close(self) -> None:
        self.proxy.client.close()


def make_app(
    live: Live,
    activation: Activation[Any],
    metrics: RouterMetrics,
    *,
    connect_timeout: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> Api:
    """The API's request handler; `close()` it once its server is shut down."""
    proxy = Proxy(live, activation, metrics, connect_timeout=connect_timeout, clock=clock)
    return Api(proxy, live)
