"""A swap's target answering its readiness probe before its endpoint turns ready.

The real proxy app and the real activation shell with its default probe
(`sidecar.http.probes.probe_ready`), the functional tests' `FakeCluster` for
the API server (the tests play the reconciler and the EndpointSlice controller), and a
fake upstream whose `/health` the test turns from 503 to 200. Held requests must go out
as soon as the target answers while the pool's status says the swap to it is Loading,
before its endpoint is ever marked ready; and never while the incumbent is unloading.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import pytest
from aiohttp import web

from sidecar.activator import LastSwap, PoolRequest, SwapProgress
from sidecar.config import RouterConfig
from sidecar.http.probes import probe_ready
from tests.functional.proxy_support import FakeUpstream, serve_app
from tests.functional.test_activation import eventually, router_config, stays
from tests.functional.test_activation_proxy import Stack, closed_port, port_of, run_stack
from tests.kube_fake import FakeCluster

pytestmark = pytest.mark.functional


@dataclass
class LoadingUpstream(FakeUpstream):
    """A member that answers `/health` 503 until `loaded` is set, as a model server does
    while it loads; it counts the probes it gets."""

    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    probes: int = 0

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        self.probes += 1
        return web.json_response({}, status=200 if self.loaded.is_set() else 503)


def early_config() -> RouterConfig:
    """The functional config, its members probed at /health as llamacpp ones are."""
    config = router_config(budget=10)
    backends = tuple(
        replace(b, readiness_path="/health") if b.pool is not None else b for b in config.backends
    )
    return replace(config, backends=backends)


@pytest.fixture
async def members() -> AsyncIterator[tuple[FakeUpstream, int, LoadingUpstream, int]]:
    coder, gemma = FakeUpstream(), LoadingUpstream()
    async with serve_app(coder.app()) as coder_url, serve_app(gemma.app()) as gemma_url:
        yield coder, port_of(coder_url), gemma, port_of(gemma_url)


def cluster(coder_port: int) -> FakeCluster:
    pools = FakeCluster()
    pools.set_pool("heavy", resident_member="coder", request=PoolRequest("coder", 1))
    pools.set_endpoints("coder", "127.0.0.1", port=coder_port)
    return pools


async def hold_for_gemma(stack: Stack, pools: FakeCluster) -> asyncio.Task[tuple[int, ...]]:
    async def post() -> tuple[int, ...]:
        status, body, _ = await stack.post("gemma")
        return status, len(body)

    held = asyncio.create_task(post())
    await eventually(lambda: len(pools.requests_for("gemma")) == 1)  # generation 2
    return held


def swap(phase: str) -> SwapProgress:
    return SwapProgress("coder", "gemma", 2, phase)


async def test_held_requests_go_out_when_the_loading_target_answers_health(
    members: tuple[FakeUpstream, int, LoadingUpstream, int],
) -> None:
    _, coder_port, gemma, gemma_port = members
    pools = cluster(coder_port)
    async with run_stack(Stack(pools, early_config())) as stack:
        held = await hold_for_gemma(stack, pools)
        # The reconciler unloaded coder and scaled gemma up: its pod has an IP, not Ready.
        pools.delete_endpoints("coder")
        pools.set_endpoints("gemma", "127.0.0.1", ready=False, port=gemma_port)
        pools.set_pool("heavy", swap=swap("Loading"))
        # Loading: the probe fails, and the request keeps waiting.
        await eventually(lambda: gemma.probes >= 3)
        assert not held.done() and gemma.received == []
        gemma.loaded.set()
        status, _ = await asyncio.wait_for(held, 5.0)
        assert status == 200 and len(gemma.received) == 1
        # Still not ready in its EndpointSlice: the next request goes straight there too.
        assert (await stack.post("gemma"))[0] == 200 and len(gemma.received) == 2
        probes = gemma.probes
        # The kubelet marks it Ready and the swap ends: the normal path serves, no probes.
        pools.set_endpoints("gemma", "127.0.0.1", port=gemma_port)
        pools.set_pool("heavy", resident_member="gemma", swap=None)
        assert (await stack.post("gemma"))[0] == 200 and len(gemma.received) == 3
        await stays(lambda: gemma.probes == probes, window=0.2)


async def test_nothing_is_dispatched_while_the_incumbent_unloads(
    members: tuple[FakeUpstream, int, LoadingUpstream, int],
) -> None:
    _, coder_port, gemma, gemma_port = members
    gemma.loaded.set()  # /health answers 200 all along
    pools = cluster(coder_port)
    async with run_stack(Stack(pools, early_config())) as stack:
        held = await hold_for_gemma(stack, pools)
        pools.set_endpoints("gemma", "127.0.0.1", ready=False, port=gemma_port)
        pools.set_pool("heavy", swap=swap("Unloading"))
        await eventually(pools.delivered)
        await stays(lambda: not held.done(), window=0.3)
        assert gemma.received == [] and gemma.probes == 0
        # The same answer counts once the status says Loading (the test above is not moot).
        pools.set_pool("heavy", swap=swap("Loading"))
        status, _ = await asyncio.wait_for(held, 5.0)
        assert status == 200 and len(gemma.received) == 1


async def test_the_prober_stops_when_the_swap_is_abandoned(
    members: tuple[FakeUpstream, int, LoadingUpstream, int],
) -> None:
    _, coder_port, gemma, gemma_port = members
    pools = cluster(coder_port)
    async with run_stack(Stack(pools, early_config())) as stack:
        held = await hold_for_gemma(stack, pools)
        pools.set_endpoints("gemma", "127.0.0.1", ready=False, port=gemma_port)
        pools.set_pool("heavy", resident_member=None, swap=swap("Loading"))
        await eventually(lambda: gemma.probes >= 2)
        pools.set_pool(
            "heavy",
            swap=None,
            request=PoolRequest(None, 3, "reconciler"),
            last_swap=LastSwap("coder", "gemma", 2, "Abandoned", 10.0, "SwapBudgetExceeded"),
        )
        status, _ = await asyncio.wait_for(held, 5.0)
        assert status == 503
        probes = gemma.probes  # one probe may still be in flight as the swap ends
        await stays(lambda: gemma.probes <= probes + 1, window=0.3)
        assert gemma.received == []


async def _serve_raw(answer: bytes | None) -> tuple[asyncio.Server, int, asyncio.Event]:
    """A socket server that reads a request and sends `answer` (None: never answers);
    the event is set once it has closed its side of the connection."""
    closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            if answer is None:
                await reader.read()  # until the prober gives up and closes
            else:
                writer.write(answer)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the prober closed first
        finally:
            writer.close()
            closed.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1]), closed


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        (b"garbage\r\n", False),
        (None, False),
    ],
)
async def test_probe_ready_is_true_only_for_a_200(answer: bytes | None, expected: bool) -> None:
    server, port, closed = await _serve_raw(answer)
    async with server:
        started = asyncio.get_running_loop().time()
        assert await probe_ready("127.0.0.1", port, "/health", 0.3) is expected
        assert asyncio.get_running_loop().time() - started < 2.0
        await asyncio.wait_for(closed.wait(), 2.0)


async def test_probe_ready_is_false_when_refused() -> None:
    assert await probe_ready("127.0.0.1", closed_port(), "/health", 0.3) is False
