"""The idle probe's HTTP half against small servers on loopback (real sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from reconciler.idle import VLLM_RUNNING, IdleCheck, Method
from reconciler.probes import HttpIdleProbe
from reconciler.swap import Verdict

pytestmark = pytest.mark.functional

SLOTS = IdleCheck(Method.SLOTS, "/slots")
VLLM = IdleCheck(Method.METRIC, "/metrics", VLLM_RUNNING, 0.0)


class Pod:
    """One fake pod: what its endpoints answer can be changed by the test."""

    def __init__(self) -> None:
        self.processing = False
        self.running = 0.0
        self.status = 200

    def app(self) -> web.Application:
        async def slots(request: web.Request) -> web.Response:
            return web.json_response([{"id": 0, "is_processing": self.processing}],
                                     status=self.status)

        async def metrics(request: web.Request) -> web.Response:
            text = f'{VLLM_RUNNING}{{model_name="m"}} {self.running}\n'
            return web.Response(text=text, status=self.status)

        async def idle(request: web.Request) -> web.Response:
            return web.Response(status=self.status)

        app = web.Application()
        app.router.add_get("/slots", slots)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/idle", idle)
        return app


@pytest.fixture
async def pods() -> AsyncIterator[list[tuple[Pod, tuple[str, int]]]]:
    started = []
    runners = []
    for _ in range(2):
        pod = Pod()
        runner = web.AppRunner(pod.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        started.append((pod, ("127.0.0.1", port)))
        runners.append(runner)
    yield started
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def probe() -> AsyncIterator[HttpIdleProbe]:
    async with aiohttp.ClientSession() as session:
        yield HttpIdleProbe(session, timeout=2.0)


async def test_slots_busy_on_any_pod_is_busy(pods: list[tuple[Pod, tuple[str, int]]],
                                            probe: HttpIdleProbe) -> None:
    addresses = [a for _, a in pods]
    assert (await probe.probe(SLOTS, addresses))[0] is Verdict.IDLE
    pods[1][0].processing = True
    verdict, detail = await probe.probe(SLOTS, addresses)
    assert verdict is Verdict.BUSY and str(addresses[1][1]) in detail


async def test_vllm_running_requests_are_busy(pods: list[tuple[Pod, tuple[str, int]]],
                                             probe: HttpIdleProbe) -> None:
    addresses = [a for _, a in pods]
    assert (await probe.probe(VLLM, addresses))[0] is Verdict.IDLE
    pods[0][0].running = 2
    assert (await probe.probe(VLLM, addresses))[0] is Verdict.BUSY
    threshold = IdleCheck(Method.METRIC, "/metrics", VLLM_RUNNING, 2.0)
    assert (await probe.probe(threshold, addresses))[0] is Verdict.IDLE


async def test_a_generic_path_is_idle_on_2xx_only(pods: list[tuple[Pod, tuple[str, int]]],
                                                 probe: HttpIdleProbe) -> None:
    check = IdleCheck(Method.PATH, "/idle")
    address = pods[0][1]
    assert (await probe.probe(check, [address]))[0] is Verdict.IDLE
    pods[0][0].status = 409
    assert (await probe.probe(check, [address]))[0] is Verdict.BUSY


async def test_errors_fail_closed(pods: list[tuple[Pod, tuple[str, int]]],
                                  probe: HttpIdleProbe) -> None:
    pods[0][0].status = 500
    verdict, detail = await probe.probe(SLOTS, [a for _, a in pods])
    assert verdict is Verdict.FAILED and "500" in detail
    # a port where nothing listens
    closed = ("127.0.0.1", 1)
    assert (await probe.probe(SLOTS, [closed]))[0] is Verdict.FAILED


async def test_a_member_without_an_idle_setting_is_unsupported(probe: HttpIdleProbe) -> None:
    verdict, detail = await probe.probe(IdleCheck(Method.UNSUPPORTED), [("127.0.0.1", 1)])
    assert verdict is Verdict.UNSUPPORTED and "spec.idle" in detail
