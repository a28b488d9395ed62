"""The idle probe's HTTP half against small servers on loopback (real sockets)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from e2e.fake_model.harness import run_fake_model
from reconciler.idle import VLLM_RUNNING, IdleCheck, Method, idle_check
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
        self.slots_body: bytes | None = None  # instead of the slots, when set
        # the answers of the next /slots readings, before `processing` applies again
        self.slots_script: list[bool] = []
        self.slots_read = 0

    def app(self) -> web.Application:
        async def slots(request: web.Request) -> web.Response:
            self.slots_read += 1
            if self.slots_body is not None:
                return web.Response(body=self.slots_body, content_type="application/json")
            processing = self.slots_script.pop(0) if self.slots_script else self.processing
            return web.json_response([{"id": 0, "is_processing": processing}],
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


async def test_an_idle_slots_reading_is_confirmed_by_the_next(
        pods: list[tuple[Pod, tuple[str, int]]], probe: HttpIdleProbe) -> None:
    """llama.cpp's hand-off of a freed slot to a queued request: one reading idle, the next
    busy. The probe reads again after an idle reading, and only two idle ones are idle."""
    pod, address = pods[0]
    pod.slots_script = [False, True]
    verdict, detail = await probe.probe(SLOTS, [address])
    assert verdict is Verdict.BUSY and "a slot is processing" in detail
    assert pod.slots_read == 2
    assert (await probe.probe(SLOTS, [address]))[0] is Verdict.IDLE
    assert pod.slots_read == 4
    pod.processing = True  # a busy reading needs no second one
    assert (await probe.probe(SLOTS, [address]))[0] is Verdict.BUSY
    assert pod.slots_read == 5


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


@pytest.mark.parametrize("body", [b"not json", b"[" * 1_500 + b"]" * 1_500])
async def test_slots_that_cannot_be_read_fail_closed(pods: list[tuple[Pod, tuple[str, int]]],
                                                     probe: HttpIdleProbe, body: bytes) -> None:
    pods[0][0].slots_body = body
    verdict, detail = await probe.probe(SLOTS, [pods[0][1]])
    assert verdict is Verdict.FAILED and str(pods[0][1][1]) in detail


async def test_a_member_without_an_idle_setting_is_unsupported(probe: HttpIdleProbe) -> None:
    verdict, detail = await probe.probe(IdleCheck(Method.UNSUPPORTED), [("127.0.0.1", 1)])
    assert verdict is Verdict.UNSUPPORTED and "spec.idle" in detail


async def test_the_activity_mark_moves_with_each_generation_of_the_fake_in_both_runtimes(
    tmp_path: Path, probe: HttpIdleProbe
) -> None:
    """What idleUnloadAfter reads, from the fake model server (held to llama.cpp's
    `/slots` by the contract suite): the mark stays while nothing is served and moves
    with every request, in llama.cpp's `/slots` and vLLM's request_success_total."""
    for mode, runtime in (("llamacpp", "llamacpp"), ("vllm", "vllm")):
        async with run_fake_model("--mode", mode, "--tokens-per-second", "1000",
                                  log_path=tmp_path / f"{mode}.log") as fake:
            check = idle_check(runtime, None)
            address = ("127.0.0.1", fake.port)
            async with aiohttp.ClientSession() as http:
                for _ in range(100):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(fake.base_url + "/health") as r:
                            if r.status == 200:
                                break
                    await asyncio.sleep(0.05)  # polling a server's start: no event to wait on
                first = await probe.activity(check, [address])
                again = await probe.activity(check, [address])
                assert first.verdict is Verdict.IDLE and first.mark == again.mark, mode
                marks = {first.mark}
                for _ in range(2):
                    async with http.post(fake.base_url + "/v1/completions",
                                         json={"prompt": "hi", "max_tokens": 2}) as r:
                        assert r.status == 200
                    reading = await probe.activity(check, [address])
                    assert reading.verdict is Verdict.IDLE and reading.mark not in marks, (
                        mode, reading, marks)
                    marks.add(reading.mark)
