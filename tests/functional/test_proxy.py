"""The router's API against a fake upstream on loopback: routing, streaming, every error
code, headers, keys and metrics. The activator is the url-only stand-in."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sidecar.app import Live, make_app
from sidecar.auth import parse_keys
from sidecar.config import parse_config
from sidecar.http.slots import EndpointSlots
from sidecar.metrics import RouterMetrics
from telemetry.health import make_health_app
from tests.functional.proxy_support import (
    REFUSED_BACKEND,
    FakeUpstream,
    StandInActivation,
    config_json,
    serve_app,
    url_backend,
)

pytestmark = pytest.mark.functional

ROUTER_FAMILIES = {
    "modelpool_held_requests",
    "modelpool_hold_duration_seconds",
    "modelpool_coalesced",
    "modelpool_requests",
    "modelpool_request_duration_seconds",
    "modelpool_time_to_first_byte_seconds",
    "modelpool_upstream_errors",
    "modelpool_errors",
}


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class Router:
    url: str
    metrics_url: str
    upstream: FakeUpstream
    activation: StandInActivation
    live: Live
    registry: CollectorRegistry
    http: aiohttp.ClientSession

    async def post(self, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.http.post(self.url + path, data=data, **kw)

    def sample(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        wanted = {"router": "chat", **labels}
        return sum(s.value for family in self.registry.collect() for s in family.samples
                   if s.name == name and wanted.items() <= s.labels.items())


@pytest.fixture
async def router(request: pytest.FixtureRequest) -> AsyncIterator[Router]:
    overrides: dict[str, Any] = dict(getattr(request, "param", {}))
    keys = overrides.pop("keys", "")
    upstream = FakeUpstream()
    async with serve_app(upstream.app()) as up_url:
        raw = config_json(
            [
                url_backend("alpha", up_url, "a1", "a2"),
                url_backend("beta", up_url + "/"),
                url_backend("dead", closed_port_url()),
                url_backend(REFUSED_BACKEND, up_url),
                url_backend("held", up_url, pool="heavy"),
            ],
            **overrides,
        )
        config = parse_config(raw)
        registry = CollectorRegistry()
        metrics = RouterMetrics(registry, "chat")
        activation = StandInActivation(config, metrics)
        live = Live(config, parse_keys(keys))
        app = make_app(live, activation, metrics, connect_timeout=2.0)
        health = make_health_app(registry, activation.ready)
        async with (
            serve_app(app) as url,
            serve_app(health) as metrics_url,
            aiohttp.ClientSession(auto_decompress=False) as http,
        ):
            yield Router(url, metrics_url, upstream, activation, live, registry, http)


async def test_routes_by_name_and_alias_and_forwards_body_unchanged(router: Router) -> None:
    body = b'{"model":  "a2", "messages": [], "odd spacing" : 1}'
    async with await router.post(body, path="/v1/chat/completions?x=1") as resp:
        assert resp.status == 200
        echo = await resp.json()
    assert echo["body"] == body.decode()
    assert echo["path"] == "/v1/chat/completions?x=1"
    async with await router.post({"model": "beta"}, path="/v1/embeddings") as resp:
        assert resp.status == 200
        assert (await resp.json())["path"] == "/v1/embeddings"
    assert router.sample("modelpool_requests_total", model="alpha", code="200") == 1
    assert router.sample("modelpool_requests_total", model="beta", code="200") == 1


async def test_stream_chunk_timing_is_preserved(router: Router) -> None:
    body = {"model": "alpha", "stream": True, "x_chunks": 6, "x_interval": 0.1}
    arrivals: list[float] = []
    async with await router.post(body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for chunk, _ in resp.content.iter_chunks():
            arrivals.append(time.monotonic())
            assert chunk.startswith(b"data: ")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # 6 events 100 ms apart, then [DONE] right after the last one.
    assert len(arrivals) >= 6
    event_gaps = gaps[:5]
    # Never bunched: a proxy that buffers gives gaps near 0. No upper bound: a late gap is
    # the machine waking the client late (0.31 s under a CPU hog), not the proxy holding a
    # chunk, which would leave the gap after it near 0.
    assert all(g >= 0.05 for g in event_gaps), gaps
    assert statistics.median(event_gaps) >= 0.08, gaps
    assert arrivals[5] - arrivals[0] >= 0.45
    assert router.sample("modelpool_time_to_first_byte_seconds_count", model="alpha") == 1


async def test_hop_by_hop_headers_are_stripped_both_ways(router: Router) -> None:
    headers = {
        "Connection": "keep-alive, X-Client-Hop",
        "X-Client-Hop": "1",
        "Keep-Alive": "timeout=5",
        "Proxy-Authorization": "Basic eA==",
        "TE": "trailers",
        "X-Custom": "kept",
        "Authorization": "Bearer upstream-key",
    }
    async with await router.post({"model": "alpha"}, headers=headers) as resp:
        assert resp.status == 200
        received = (await resp.json())["headers"]
        for name in ("keep-alive", "proxy-authenticate", "x-hop"):
            assert name not in {k.lower() for k in resp.headers}, name
        assert resp.headers["X-Upstream"] == "yes"
    for name in ("x-client-hop", "keep-alive", "proxy-authorization", "te"):
        assert name not in received, name
    assert received["x-custom"] == "kept"
    # Without router keys, the client's key is the upstream's business.
    assert received["authorization"] == "Bearer upstream-key"


async def test_upstream_status_passes_through(router: Router) -> None:
    async with await router.post({"model": "alpha", "x_status": 418}) as resp:
        assert resp.status == 418
    assert router.sample("modelpool_requests_total", model="alpha", code="418") == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", None),
        (b"\xff\xfe", None),
        (b"[1, 2]", None),
        (b'{"messages": []}', "model"),
        (b'{"model": 7}', "model"),
        (b'{"model": ""}', "model"),
        # Nested deeper than the interpreter's recursion limit: still a bad body, not a 500.
        (b'{"model": "alpha", "x": ' + b"[" * 1_500 + b"]" * 1_500 + b"}", None),
    ],
)
async def test_bad_body_is_400(router: Router, body: bytes, param: str | None) -> None:
    async with await router.post(body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}
    assert router.upstream.received == []


async def test_unknown_model_is_404_without_default_route(router: Router) -> None:
    async with await router.post({"model": "nope"}) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["code"] == "model_not_found"
    assert "nope" in error["message"]
    assert router.sample("modelpool_requests_total", model="unknown", code="404") == 1


@pytest.mark.parametrize("router", [dict(defaultRoute="beta")], indirect=True)
async def test_unknown_model_goes_to_default_route(router: Router) -> None:
    async with await router.post({"model": "nope"}) as resp:
        assert resp.status == 200
    assert router.sample("modelpool_requests_total", model="beta", code="200") == 1


STATIC = {"defaultRoute": "beta", "routeStrategy": "Static"}


@pytest.mark.parametrize("router", [STATIC], indirect=True)
async def test_static_strategy_always_uses_default_route(router: Router) -> None:
    async with await router.post({"model": "alpha"}) as resp:
        assert resp.status == 200
    assert router.sample("modelpool_requests_total", model="beta", code="200") == 1


async def test_body_over_limit_is_413_with_and_without_content_length(router: Router) -> None:
    big = json.dumps({"model": "alpha", "pad": "x" * 5000}).encode()
    async with await router.post(big) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "request_too_large"

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    async with router.http.post(router.url + "/v1/chat/completions", data=chunked()) as resp:
        assert resp.status == 413
    assert router.upstream.received == []
    # Just under the limit still passes.
    ok = json.dumps({"model": "alpha", "pad": "x" * 3000}).encode()
    async with await router.post(ok) as resp:
        assert resp.status == 200


async def test_refused_connection_is_502_and_reported(router: Router) -> None:
    async with await router.post({"model": "dead"}) as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
    assert error["code"] == "upstream_connect_failed"
    assert [t.backend for t in router.activation.connect_failures] == ["dead"]
    assert router.sample("modelpool_upstream_errors_total", backend="dead", kind="connect") == 1
    assert router.sample("modelpool_requests_total", model="dead", code="502") == 1


@pytest.mark.parametrize("router", [dict(responseHeaderTimeoutSeconds=0.3)], indirect=True)
async def test_upstream_timeout_is_504(router: Router) -> None:
    started = time.monotonic()
    async with await router.post({"model": "alpha", "x_sleep": 3}) as resp:
        assert resp.status == 504
        assert (await resp.json())["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - started < 2.5
    assert router.sample("modelpool_upstream_errors_total", backend="alpha", kind="timeout") == 1
    assert router.activation.connect_failures == []


async def test_activation_refusal_is_503_with_integer_retry_after(router: Router) -> None:
    async with await router.post({"model": REFUSED_BACKEND}) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "3"
        error = (await resp.json())["error"]
    assert error["code"] == "swap_budget_exceeded"
    assert router.sample("modelpool_requests_total", model=REFUSED_BACKEND, code="503") == 1
    assert router.sample("modelpool_errors_total", model=REFUSED_BACKEND, code="503",
                         reason="swap_budget_exceeded") == 1


async def test_upstream_breaking_mid_stream_aborts_the_client(router: Router) -> None:
    body = {"model": "alpha", "stream": True, "x_chunks": 5, "x_interval": 0.02, "x_break": 2}
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with await router.post(body) as resp:
            assert resp.status == 200
            async for chunk, _ in resp.content.iter_chunks():
                received += chunk
    assert received.count(b"data: ") == 2
    assert router.sample("modelpool_upstream_errors_total", backend="alpha", kind="disconnect") == 1


async def test_client_leaving_a_held_request_gives_up_its_place(router: Router) -> None:
    task = asyncio.create_task(router.post({"model": "held"}))
    await _until(lambda: router.activation.held == 1)
    task.cancel()
    await _until(lambda: router.activation.held == 0)
    await _until(lambda: router.sample("modelpool_requests_total", model="held", code="499") == 1)


async def test_a_client_that_leaves_on_the_last_event_of_a_stream_was_answered(
    router: Router,
) -> None:
    """openai-python closes the connection as soon as it reads `data: [DONE]`, before the
    chunked body's end: the request was served whole, and counts as 200, not 499."""
    body = {"model": "alpha", "stream": True, "x_chunks": 2, "x_interval": 0,
            "x_end_when_released": True}
    async with await router.post(body) as resp:
        assert resp.status == 200
        received = b""
        while not received.endswith(b"data: [DONE]\n\n"):
            received += await resp.content.readany()
        resp.connection.close()
    router.upstream.release.set()  # the upstream ends its body after the client left
    await _until(lambda: router.sample("modelpool_requests_total", model="alpha",
                                       code="200") == 1)
    assert router.sample("modelpool_requests_total", model="alpha", code="499") == 0


async def test_a_client_that_leaves_before_the_last_event_is_499(router: Router) -> None:
    body = {"model": "alpha", "stream": True, "x_until_released": True, "x_interval": 0.01}
    async with await router.post(body) as resp:
        assert resp.status == 200
        await resp.content.readany()
        resp.connection.close()
    await _until(lambda: router.sample("modelpool_requests_total", model="alpha",
                                       code="499") == 1)
    router.upstream.release.set()
    assert router.sample("modelpool_requests_total", model="alpha", code="200") == 0


KEYS = {"keys": "# router keys\nkey-one\n\n key-two \n"}


@pytest.mark.parametrize("router", [KEYS], indirect=True)
async def test_api_keys(router: Router) -> None:
    cases = [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": "key-one"}, 401),
        ({"Authorization": "Bearer key-one"}, 200),
        ({"Authorization": "bearer key-two"}, 200),
    ]
    for headers, status in cases:
        async with await router.post({"model": "alpha"}, headers=headers) as resp:
            assert resp.status == status, headers
            if status == 401:
                assert (await resp.json())["error"]["code"] == "invalid_api_key"
            else:
                # The router's own key never reaches the upstream.
                assert "authorization" not in (await resp.json())["headers"]
        async with router.http.get(router.url + "/v1/models", headers=headers) as resp:
            assert resp.status == status
    assert len(router.upstream.received) == 2


async def test_unknown_paths_and_wrong_methods_get_openai_shaped_404_and_405(
    router: Router,
) -> None:
    async with router.http.get(router.url + "/v1/nothing-here") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "unknown_url"
    async with router.http.get(router.url + "/v1/chat/completions") as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert (await resp.json())["error"]["code"] == "method_not_allowed"
    async with router.http.post(router.url + "/v1/models") as resp:
        assert (resp.status, resp.headers["Allow"]) == (405, "GET")
    assert router.upstream.received == []


async def test_no_keys_means_open(router: Router) -> None:
    async with await router.post({"model": "alpha"}) as resp:
        assert resp.status == 200


async def test_models_lists_names_and_aliases_with_state(router: Router) -> None:
    async with router.http.get(router.url + "/v1/models") as resp:
        assert resp.status == 200
        listing = await resp.json()
    assert listing["object"] == "list"
    by_id = {m["id"]: m for m in listing["data"]}
    assert set(by_id) == {"alpha", "a1", "a2", "beta", "dead", REFUSED_BACKEND, "held"}
    assert all(m["object"] == "model" for m in listing["data"])
    assert by_id["a1"]["state"] == "ready"
    assert by_id["a1"]["backend"] == "alpha"
    assert by_id["held"]["state"] == "stopped"


async def test_metrics_endpoint_has_every_family(router: Router) -> None:
    async with await router.post({"model": "alpha", "stream": True, "x_chunks": 2}) as resp:
        await resp.read()
    async with router.http.get(router.metrics_url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= ROUTER_FAMILIES
    requests = {
        (s.labels["model"], s.labels["code"]): s.value
        for s in families["modelpool_requests"].samples
        if s.name == "modelpool_requests_total"
    }
    assert requests == {("alpha", "200"): 1.0}
    for path, status in (("/healthz", 200), ("/readyz", 200)):
        async with router.http.get(router.metrics_url + path) as resp:
            assert resp.status == status


async def test_config_change_applies_to_new_requests(router: Router) -> None:
    alpha = router.live.config.backend("alpha")
    assert alpha is not None and alpha.url is not None
    raw = config_json([url_backend("gamma", alpha.url)])
    router.live.apply_config(parse_config(raw))
    async with await router.post({"model": "gamma"}) as resp:
        assert resp.status == 200
    async with await router.post({"model": "alpha"}) as resp:
        assert resp.status == 404


async def _until(condition: Any, limit: float = 10.0) -> None:
    async with asyncio.timeout(limit):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


async def test_endpoint_slots_bound_in_flight_per_endpoint_and_forget_idle_ones() -> None:
    slots = EndpointSlots(2)
    running = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}
    gate = asyncio.Event()

    async def one(endpoint: str) -> None:
        await slots.acquire(endpoint)
        try:
            running[endpoint] += 1
            peak[endpoint] = max(peak[endpoint], running[endpoint])
            await gate.wait()
            running[endpoint] -= 1
        finally:
            slots.release(endpoint)

    tasks = [asyncio.create_task(one("a")) for _ in range(5)]
    tasks.append(asyncio.create_task(one("b")))
    await _until(lambda: running == {"a": 2, "b": 1})
    gate.set()
    await asyncio.gather(*tasks)
    assert peak == {"a": 2, "b": 1}
    assert len(slots) == 0


async def test_endpoint_slots_serve_waiters_in_order_and_skip_cancelled_ones() -> None:
    slots = EndpointSlots(1)
    await slots.acquire("a")  # the one slot is taken
    order: list[int] = []

    async def wait(i: int) -> None:
        await slots.acquire("a")
        order.append(i)

    first, second, third = (asyncio.create_task(wait(i)) for i in (1, 2, 3))
    await _until(lambda: len(slots._waiters.get("a", ())) == 3)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    slots.release("a")
    await first
    slots.release("a")
    await third
    assert order == [1, 3]
    slots.release("a")
    assert len(slots) == 0
    await slots.acquire("a")  # the slot is free again, at once
    slots.release("a")


async def test_endpoint_slots_pass_on_a_slot_handed_to_a_waiter_cancelled_meanwhile() -> None:
    slots = EndpointSlots(1)
    await slots.acquire("a")
    waiter = asyncio.create_task(slots.acquire("a"))
    behind = asyncio.create_task(slots.acquire("a"))
    await _until(lambda: len(slots._waiters.get("a", ())) == 2)
    slots.release("a")  # hands the slot to `waiter`...
    waiter.cancel()  # ...which is cancelled before it runs: the slot goes on to `behind`
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(behind, 5)
    slots.release("a")
    assert len(slots) == 0
