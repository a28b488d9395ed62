"""The router's API: routes a request by its `model`, activates, forwards.

Every path a member runtime serves that names a model (`sidecar.apis`: the OpenAI paths,
Responses, Anthropic Messages, rerank, audio, tokenize...) is routed by the `model` of its
JSON body, or of its form for audio uploads; the router's own answers on it speak the
caller's dialect (`sidecar.dialects`). `/upstream/{backend}/...` reaches any other path of
one backend, activated as usual.

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

from sidecar import apis, dead_endpoint, dialects, errors, fallback, multipart
from sidecar.apis import Api as ApiOfPath
from sidecar.auth import NO_KEYS, ApiKeys
from sidecar.config import BackendConfig, RouterConfig
from sidecar.errors import ProxyError
from sidecar.held_stream import HeldStream
from sidecar.http.client import Client
from sidecar.http.headers import request_headers
from sidecar.http.messages import Reply, Request
from sidecar.http.slots import MAX_IN_FLIGHT_PER_ENDPOINT, EndpointSlots
from sidecar.metrics import RouterMetrics
from sidecar.relay import Relay, forward
from sidecar.routing import Routes, build_routes

logger = logging.getLogger(__name__)

# requests_total's `model` label is the backend name, so a client cannot grow it at will;
# requests that never reached a backend use these.
UNROUTED = ""
UNKNOWN_MODEL = "unknown"
# nginx's convention for a request the client abandoned.
CLIENT_CLOSED = 499
# The router's own key, in either header a client sends it in: not the upstream's business.
_ROUTER_KEY = frozenset({b"authorization", b"x-api-key"})
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

    async def routed(self, request: Request, reply: Reply, api: ApiOfPath) -> None:
        """A request on a path routed by its `model` (`api` says which API it speaks)."""
        started = self._clock()
        label = UNROUTED
        held: HeldStream | None = None
        try:
            self._authorize(request)
            live = self._live
            body = request.body
            model, streamed = _form_model(request) if api.form else _model_of(body)
            backend = live.routes.resolve(model) if model is not None else live.routes.default
            if backend is None:
                if model is None:
                    raise errors.bad_request(_NO_MODEL_FORM if api.form else _NO_MODEL,
                                             param="model")
                label = UNKNOWN_MODEL
                raise errors.model_not_found(model)
            if backend.fallback is not None:
                backend, rewrite = fallback.choose(backend, live.config,
                                                   self._activation.serves_now,
                                                   self._activation.swap_can_start)
                if rewrite is not None and not api.form:
                    body = fallback.with_model(body, rewrite)
            label = backend.name
            if streamed:
                held = HeldStream(request, reply, backend.name,
                                  live.config.held_stream_keepalive_seconds,
                                  functools.partial(self._activation.hold_progress, backend),
                                  as_content=(live.config.held_stream_progress == "content"
                                              and api.delta is not None))
            relay = await self._dispatch(request, reply, backend, body, started, held, api)
        except asyncio.CancelledError:
            # The client went away (the server cancels its handler): a held request
            # leaves its place in the queue by this cancellation.
            code = reply.status if _delivered(reply) else CLIENT_CLOSED
            self._metrics.request_done(label, code, self._clock() - started, api.label)
            raise
        except ProxyError as err:
            self._metrics.request_done(label, err.status, self._clock() - started, api.label)
            self._metrics.error(label, err.status, err.code)
            if held is not None and held.started:  # its 200 went out: the error is an event
                await held.end_with(dialects.stream_error(err, api))
            else:
                await reply.send(*dialects.answer(err, api))
            return
        self._done(relay, reply, label, started, api)

    async def door(self, request: Request, reply: Reply, door: apis.UpstreamDoor) -> None:
        """`/upstream/{backend}/{path}`: any path and method of one backend, activated as a
        routed request is, behind the same key."""
        started = self._clock()
        label = UNROUTED
        api = apis.UPSTREAM
        try:
            self._authorize(request)
            backend = self._live.routes.by_name.get(door.backend) if door.backend else None
            if backend is None:
                label = UNKNOWN_MODEL
                raise errors.ProxyError(
                    404, f"No backend '{door.backend}' on this router: /upstream/ takes a"
                    " backend's name, then the path of that backend to reach.",
                    type="invalid_request_error", code="backend_not_found")
            label = backend.name
            inner = Request(request.method, door.target, request.raw_headers, request.body,
                            request.keep_alive)
            relay = await self._dispatch(inner, reply, backend, request.body, started, None, api)
        except asyncio.CancelledError:
            self._metrics.request_done(label, CLIENT_CLOSED, self._clock() - started, api.label)
            raise
        except ProxyError as err:
            self._metrics.request_done(label, err.status, self._clock() - started, api.label)
            self._metrics.error(label, err.status, err.code)
            await reply.send(*errors.answer(err))
            return
        self._done(relay, reply, label, started, api)

    def _done(self, relay: Relay, reply: Reply, label: str, started: float,
              api: ApiOfPath) -> None:
        if relay.upstream_failure is not None:
            self._metrics.upstream_error(label, relay.upstream_failure)
        gone = relay.client_gone and not _delivered(reply)
        code = CLIENT_CLOSED if gone else relay.answered or relay.status
        self._metrics.request_done(label, code, self._clock() - started, api.label)

    async def _dispatch(
        self,
        request: Request,
        reply: Reply,
        backend: BackendConfig,
        body: bytes,
        started: float,
        held: HeldStream | None,
        api: ApiOfPath,
    ) -> Relay:
        live = self._live
        headers = request_headers(
            request.raw_headers,
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
                        error_event=dialects.upstream_error_event(api),
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
        if keys.enabled and not keys.allows(request.header(b"authorization"),
                                            request.header(b"x-api-key")):
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


_NO_MODEL = "Request body needs a string 'model' field (this router has no defaultRoute)."
_NO_MODEL_FORM = "The form needs a 'model' field (this router has no defaultRoute)."


def _model_of(body: bytes) -> tuple[str | None, bool]:
    """The JSON body's `model` (None where it has none), and whether it asks for a stream."""
    try:
        payload = parse_json(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.bad_request(f"Request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise errors.bad_request("Request body nests arrays or objects too deeply.") from e
    if not isinstance(payload, dict):
        raise errors.bad_request("Request body must be a JSON object.")
    model = payload.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise errors.bad_request("The 'model' field must be a non-empty string.", param="model")
    return model, payload.get("stream") is True


def _form_model(request: Request) -> tuple[str | None, bool]:
    """The `model` field of a multipart form (None where it has none); a form is never
    held as a stream (its answer's `stream` is a form field the router does not read)."""
    try:
        model = multipart.form_field(request.body, request.header(b"content-type"), "model")
    except multipart.FormError as e:
        raise errors.bad_request(f"Request body is not a multipart form: {e}.") from e
    if model is not None and not model:
        raise errors.bad_request("The form's 'model' field is empty.", param="model")
    return model, False


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
        api = apis.api_of(path)
        if api is not None:
            if method == "POST":
                await self.proxy.routed(request, reply, api)
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
            door = apis.upstream_door(path, request.target)
            if door is not None:
                await self.proxy.door(request, reply, door)
                return
            await reply.send(*errors.answer(errors.not_found(path)))
            return
        status, headers, body = dialects.answer(errors.method_not_allowed(method, path),
                                                api or apis.CHAT)
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
