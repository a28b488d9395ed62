"""The real proxy app in front of the real activation shell: what a client sees.

The API server is the functional tests' `FakeCluster` (our own KubePort); the members are
fake upstreams on loopback sockets. This pins the interface between the proxy and the
activator: a held request answered once the member is resident, a refused hold as 503
with Retry-After, and no 502 at all after the resident's pod dies: the request that finds
the dead address is held and dispatched again.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from sidecar.activation import Activation
from sidecar.activator import PoolRequest
from sidecar.app import Live, make_app
from sidecar.config import RouterConfig
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import FakeUpstream, serve_app
from tests.functional.test_activation import eventually, router_config, stays
from tests.kube_fake import FakeCluster

pytestmark = pytest.mark.functional


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    def __init__(self, pools: FakeCluster, config: RouterConfig) -> None:
        self.pools = pools
        self.registry = CollectorRegistry()
        self.activation = Activation(
            config, pools, RouterMetrics(self.registry, "chat"), identity="demo/chat/a"
        )
        self.app = make_app(
            Live(config), self.activation, RouterMetrics(CollectorRegistry(), "chat")
        )
        self.url = ""
        self.session: aiohttp.ClientSession | None = None

    async def post(self, model: str, **extra: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        assert self.session is not None
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as r:
            return r.status, await r.json(), dict(r.headers)


@pytest.fixture
async def upstreams() -> AsyncIterator[tuple[FakeUpstream, str, FakeUpstream, str]]:
    coder, gemma = FakeUpstream(), FakeUpstream()
    async with serve_app(coder.app()) as coder_url, serve_app(gemma.app()) as gemma_url:
        yield coder, coder_url, gemma, gemma_url


def coder_resident(coder_url: str) -> FakeCluster:
    """The pool with coder resident at `coder_url`, gemma stopped."""
    pools = FakeCluster()
    pools.set_pool("heavy", resident_member="coder", request=PoolRequest("coder", 1))
    pools.set_endpoints("coder", "127.0.0.1", port=port_of(coder_url))
    return pools


@asynccontextmanager
async def run_stack(stack: Stack) -> AsyncIterator[Stack]:
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(stack.activation.run())
        try:
            await eventually(stack.activation.ready)
            async with serve_app(stack.app) as url, aiohttp.ClientSession() as session:
                stack.url, stack.session = url, session
                yield stack
        finally:
            task.cancel()


async def test_a_held_request_is_answered_by_the_member_after_its_swap(
    upstreams: tuple[FakeUpstream, str, FakeUpstream, str],
) -> None:
    coder, coder_url, gemma, gemma_url = upstreams
    pools = coder_resident(coder_url)
    async with run_stack(Stack(pools, router_config(budget=10))) as stack:
        status, _, _ = await stack.post("coder")
        assert status == 200 and len(coder.received) == 1
        held = asyncio.create_task(stack.post("gemma"))
        await eventually(lambda: len(pools.requests_for("gemma")) == 1)
        assert not held.done()
        pools.set_endpoints("gemma", "127.0.0.1", port=port_of(gemma_url))
        pools.set_pool("heavy", resident_member="gemma")
        status, _, _ = await held
        assert status == 200 and len(gemma.received) == 1


async def test_past_the_budget_the_client_gets_503_with_retry_after(
    upstreams: tuple[FakeUpstream, str, FakeUpstream, str],
) -> None:
    _, coder_url, gemma, _ = upstreams
    pools = coder_resident(coder_url)
    async with run_stack(Stack(pools, router_config(budget=0.3))) as stack:
        status, body, headers = await stack.post("gemma")
        assert status == 503
        assert int(headers["Retry-After"]) >= 1
        assert body["error"]["code"] == "swap_budget_exceeded"
        assert gemma.received == []


async def test_no_run_of_stale_502s_after_the_resident_dies(
    upstreams: tuple[FakeUpstream, str, FakeUpstream, str],
) -> None:
    coder, coder_url, _, _ = upstreams
    pools = FakeCluster()
    pools.set_pool("heavy", resident_member="coder", request=PoolRequest("coder", 1))
    # The resident's pod is gone; its EndpointSlice still names its address as ready.
    pools.set_endpoints("coder", "127.0.0.1", port=closed_port())
    async with run_stack(Stack(pools, router_config(budget=10))) as stack:
        # The first request finds the address dead, reports it and is dispatched again
        # through the activator: it is held with every later one, not answered 502.
        requests = [asyncio.create_task(stack.post("coder")) for _ in range(6)]
        await eventually(
            lambda: stack.registry.get_sample_value(
                "modelpool_held_requests", {"router": "chat", "pool": "heavy", "member": "coder"}
            ) == 6
        )
        await stays(lambda: not any(t.done() for t in requests), window=0.2)
        started = time.monotonic()
        pools.set_endpoints("coder", "127.0.0.1", port=port_of(coder_url))
        results = await asyncio.gather(*requests)
        assert [r[0] for r in results] == [200] * 6
        assert time.monotonic() - started < 5.0
        assert len(coder.received) == 6


def config_with(*, budget: float, header_timeout: float, max_held: int = 100) -> RouterConfig:
    config = router_config(budget=budget, max_held=max_held)
    return replace(config, response_header_timeout_seconds=header_timeout)


async def test_a_hold_outlasts_the_response_header_timeout_up_to_the_swap_budget(
    upstreams: tuple[FakeUpstream, str, FakeUpstream, str],
) -> None:
    """swapBudget bounds the hold; responseHeaderTimeout (a generation's time) starts only
    once the member is resident. A hold longer than the generation timeout is answered."""
    _, coder_url, gemma, gemma_url = upstreams
    pools = coder_resident(coder_url)
    async with run_stack(Stack(pools, config_with(budget=30, header_timeout=0.2))) as stack:
        held = asyncio.create_task(stack.post("gemma"))
        await eventually(lambda: len(pools.requests_for("gemma")) == 1)
        # The property is about time itself: the hold must survive well past the 0.2 s
        # generation timeout, so a window of three times it is the check.
        await stays(lambda: not held.done(), window=0.6)
        pools.set_endpoints("gemma", "127.0.0.1", port=port_of(gemma_url))
        pools.set_pool("heavy", resident_member="gemma")
        status, body, _ = await held
        assert status == 200, body
        assert len(gemma.received) == 1


async def test_over_max_held_requests_the_client_gets_503_with_retry_after_never_429(
    upstreams: tuple[FakeUpstream, str, FakeUpstream, str],
) -> None:
    _, coder_url, gemma, _ = upstreams
    pools = coder_resident(coder_url)
    async with run_stack(Stack(pools, config_with(budget=30, header_timeout=5,
                                                  max_held=1))) as stack:
        held = asyncio.create_task(stack.post("gemma"))
        await eventually(lambda: stack.registry.get_sample_value(
            "modelpool_held_requests", {"router": "chat", "pool": "heavy", "member": "gemma"}
        ) == 1)
        status, body, headers = await stack.post("gemma")
        assert status == 503, (status, body)
        assert int(headers["Retry-After"]) >= 1
        assert body["error"]["code"] == "too_many_held_requests"
        assert body["error"]["type"]
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
        assert gemma.received == []
