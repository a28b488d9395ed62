"""The fake model server as its users meet it: a real process on a loopback port, driven
through the official ``openai`` SDK and plain HTTP (docs/contracts.md section 4)."""

from __future__ import annotations

import asyncio
import itertools
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.fake_model.gpu_lock import GpuInUseError, GpuLocks, holders
from e2e.fake_model.harness import (
    POLL_INTERVAL_SECONDS,
    REPO_ROOT,
    FakeModelProcess,
    child_environment,
    run_fake_model,
    start_fake_model,
)
from e2e.fake_model.replies import text_of

pytestmark = pytest.mark.functional


def _client(server: FakeModelProcess) -> openai.AsyncOpenAI:
    # No retries: a 503 must reach the test, not be retried away.
    return openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # force_close: every request opens a new connection, so "not accepting" is observable.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as s:
        yield s


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        response.raise_for_status()
        return await response.json()


async def _metrics(session: aiohttp.ClientSession, server: FakeModelProcess) -> dict[str, float]:
    async with session.get(f"{server.base_url}/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _poll(condition: Any, what: str, limit: float = 10.0) -> None:
    """Await ``condition()`` until it returns true, failing after ``limit`` seconds."""
    try:
        async with asyncio.timeout(limit):
            while True:
                if await condition():
                    return
                await asyncio.sleep(POLL_INTERVAL_SECONDS)
    except TimeoutError:
        pytest.fail(f"timed out waiting until {what}")


async def test_health_answers_503_while_loading_then_200(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    # Long enough that the server listens before it has passed, even when the interpreter
    # takes seconds to start on a busy machine.
    spawned = time.monotonic()
    async with run_fake_model(
        "--load-time", "5", log_path=tmp_path / "fake.log", wait_ready=False
    ) as server:
        assert await server.wait_for_health({200, 503}) == 503
        async with session.get(f"{server.base_url}/health") as response:
            assert response.status == 503
            assert await response.json() == {"status": "loading"}
        async with _client(server) as client:
            with pytest.raises(openai.APIStatusError) as raised:
                await client.chat.completions.create(
                    model="any", messages=[{"role": "user", "content": "hi"}]
                )
            assert raised.value.status_code == 503

            await server.wait_ready()
            assert time.monotonic() - spawned >= 5.0
            # The load time counts from exec: the interpreter's start-up was part of it.
            assert re.search(r"loading fake-model for [0-4]\.\d+s", server.log())
            reply = await client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "hi"}]
            )
            assert reply.choices[0].message.content == text_of(16)


async def test_load_time_and_rate_come_from_the_environment(tmp_path: Path) -> None:
    env = {"FAKE_MODEL_LOAD_TIME": "1.5", "FAKE_MODEL_TOKENS_PER_SECOND": "10"}
    spawned = time.monotonic()
    async with run_fake_model(log_path=tmp_path / "fake.log", env=env) as server:
        assert time.monotonic() - spawned >= 1.5
        async with _client(server) as client:
            started = time.monotonic()
            await client.completions.create(model="any", prompt="hi", max_tokens=5)
            assert time.monotonic() - started >= 0.45


async def test_chat_completion_through_the_sdk(tmp_path: Path) -> None:
    async with (
        run_fake_model("-m", "/models/qwen.gguf", log_path=tmp_path / "fake.log") as server,
        _client(server) as client,
    ):
        reply = await client.chat.completions.create(
            model="whatever-the-router-sent",
            messages=[{"role": "user", "content": "say five words please"}],
            max_tokens=5,
        )
    assert reply.model == "qwen"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "the pool shares one GPU"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 5)
    assert reply.usage.total_tokens == 9


async def test_streamed_chat_is_paced_at_the_token_rate(tmp_path: Path) -> None:
    async with (
        run_fake_model("--tokens-per-second", "20", log_path=tmp_path / "fake.log") as server,
        _client(server) as client,
    ):
        started = time.monotonic()
        stream = await client.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
        arrivals: list[float] = []
        pieces: list[str] = []
        finish: list[str | None] = []
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    arrivals.append(time.monotonic())
                    pieces.append(choice.delta.content)
                finish.append(choice.finish_reason)
        elapsed = time.monotonic() - started

    assert "".join(pieces) == text_of(10)
    assert len(pieces) == 10
    assert finish[-1] == "length"
    assert usage is not None and usage.completion_tokens == 10
    assert elapsed >= 0.35
    assert elapsed < 5.0
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert 0.025 <= statistics.median(gaps) <= 0.2


async def test_text_completions_stream_and_not(tmp_path: Path) -> None:
    async with (
        run_fake_model("--served-model-name", "coder", log_path=tmp_path / "fake.log") as server,
        _client(server) as client,
    ):
        whole = await client.completions.create(model="coder", prompt="one two", max_tokens=3)
        stream = await client.completions.create(
            model="coder", prompt="one two", max_tokens=3, stream=True
        )
        streamed = [chunk async for chunk in stream]
    assert whole.model == "coder"
    assert whole.choices[0].text == "the pool shares"
    assert whole.usage is not None and whole.usage.total_tokens == 5
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "the pool shares"
    assert streamed[-1].choices[0].finish_reason == "length"
    # Without include_usage the usage rides on the last chunk, as llama.cpp sends it.
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 3


async def test_embeddings_are_deterministic(tmp_path: Path) -> None:
    async with run_fake_model(log_path=tmp_path / "fake.log") as server, _client(server) as client:
        # The SDK asks for base64 unless told otherwise, and decodes it.
        first = await client.embeddings.create(model="any", input=["alpha", "beta"])
        again = await client.embeddings.create(
            model="any", input="alpha", encoding_format="float"
        )
        small = await client.embeddings.create(model="any", input="alpha", dimensions=4)
    alpha, beta = (item.embedding for item in first.data)
    assert len(alpha) == 16
    assert again.data[0].embedding == pytest.approx(alpha, abs=1e-6)
    assert alpha != pytest.approx(beta, abs=1e-3)
    assert sum(v * v for v in alpha) == pytest.approx(1.0, abs=1e-4)
    assert len(small.data[0].embedding) == 4


async def test_models_lists_the_served_id(tmp_path: Path) -> None:
    async with (
        run_fake_model("--model", "/w/gemma-2b.Q4.gguf", log_path=tmp_path / "f.log") as server,
        _client(server) as client,
    ):
        ids = [model.id async for model in client.models.list()]
    assert ids == ["gemma-2b.Q4"]


async def test_bad_requests_get_openai_errors(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with run_fake_model(log_path=tmp_path / "fake.log") as server:
        url = f"{server.base_url}/v1/chat/completions"
        async with session.post(url, data=b"{not json") as response:
            assert response.status == 400
            assert (await response.json())["error"]["type"] == "invalid_request_error"
        async with session.post(url, json={"messages": [], "max_tokens": -1}) as response:
            assert response.status == 400


async def test_slots_show_processing_during_a_stream(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with (
        run_fake_model(
            "--mode", "llamacpp", "-np", "2", "--tokens-per-second", "20",
            log_path=tmp_path / "fake.log",
        ) as server,
        _client(server) as client,
    ):  # fmt: skip
        slots_url = f"{server.base_url}/slots"
        idle = await _get_json(session, slots_url)
        assert [slot["is_processing"] for slot in idle] == [False, False]

        stream = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=20, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        busy = await _get_json(session, slots_url)
        assert sum(slot["is_processing"] for slot in busy) == 1
        async for _ in stream:
            pass

        async def all_idle() -> bool:
            slots = await _get_json(session, slots_url)
            return not any(slot["is_processing"] for slot in slots)

        await _poll(all_idle, "no slot is processing")


async def test_vllm_metrics_count_running_and_waiting(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with (
        run_fake_model(
            "--mode", "vllm", "--max-num-seqs", "1", "--tokens-per-second", "20",
            log_path=tmp_path / "fake.log",
        ) as server,
        _client(server) as client,
    ):  # fmt: skip
        running, waiting = "vllm:num_requests_running", "vllm:num_requests_waiting"
        idle = await _metrics(session, server)
        assert (idle[running], idle[waiting]) == (0.0, 0.0)

        async def complete() -> None:
            await client.completions.create(model="any", prompt="hi", max_tokens=20)

        requests = [asyncio.create_task(complete()) for _ in range(2)]

        async def one_runs_one_waits() -> bool:
            sample = await _metrics(session, server)
            return (sample[running], sample[waiting]) == (1.0, 1.0)

        await _poll(one_runs_one_waits, "one request runs and one waits")
        await asyncio.gather(*requests)

        async def drained() -> bool:
            sample = await _metrics(session, server)
            return (sample[running], sample[waiting]) == (0.0, 0.0)

        await _poll(drained, "nothing runs or waits")
        finished = (await _metrics(session, server))["vllm:request_success_total"]
        assert finished == 2.0


async def test_a_second_server_on_a_held_gpu_exits_with_an_error(tmp_path: Path) -> None:
    gpu0 = {"NVIDIA_VISIBLE_DEVICES": "0", "MODELPOOL_GPU_LOCK_DIR": str(tmp_path / "locks")}
    gpu1 = {**gpu0, "NVIDIA_VISIBLE_DEVICES": "1"}
    async with run_fake_model(log_path=tmp_path / "first.log", env=gpu0) as first:
        assert holders(tmp_path / "locks") == {"0": first.process.pid}
        second = await start_fake_model(log_path=tmp_path / "second.log", env=gpu0)
        assert await second.wait_exit() == 3
        assert "GPU 0 is already in use" in second.log()
        # Another device is free.
        async with run_fake_model(log_path=tmp_path / "other.log", env=gpu1):
            pass
        assert await first.stop() == 0
        assert holders(tmp_path / "locks") == {}
    async with run_fake_model(log_path=tmp_path / "third.log", env=gpu0) as third:
        assert holders(tmp_path / "locks") == {"0": third.process.pid}


async def test_gpu_lock_is_held_through_the_unload_time(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    env = {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "MODELPOOL_GPU_LOCK_DIR": str(lock_dir),
        "FAKE_MODEL_UNLOAD_TIME": "2",
    }
    async with run_fake_model(log_path=tmp_path / "fake.log", env=env) as server:
        signalled = time.monotonic()
        server.send_signal()
        # Probed from this process, so no child's start-up time races the unload.
        with pytest.raises(GpuInUseError):
            GpuLocks(lock_dir, ["0"]).acquire()
        assert await server.wait_exit() == 0
        assert time.monotonic() - signalled >= 2.0
    with GpuLocks(lock_dir, ["0"]):
        pass


async def test_fail_load_never_turns_healthy(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with run_fake_model(
        log_path=tmp_path / "fake.log", env={"FAKE_MODEL_FAIL_LOAD": "1"}, wait_ready=False
    ) as server:
        assert await server.wait_for_health({200, 503}) == 503
        # An observation window, not a synchronisation: health must stay 503 throughout.
        window_ends = time.monotonic() + 1.0
        while time.monotonic() < window_ends:
            assert await server.health_status(session) == 503
            await asyncio.sleep(POLL_INTERVAL_SECONDS)
        async with session.post(
            f"{server.base_url}/v1/completions", json={"prompt": "hi"}
        ) as response:
            assert response.status == 503
        assert await server.stop() == 0


async def test_sigterm_finishes_the_stream_in_flight(tmp_path: Path) -> None:
    # 60 tokens at 20 a second: the stream outlasts the signal by about 3 s, room for the
    # probes below to see the listener closed on a loaded machine.
    server = await start_fake_model(
        "--tokens-per-second", "20", log_path=tmp_path / "fake.log"
    )
    try:
        await server.wait_ready()
        async with _client(server) as client:
            stream = await client.chat.completions.create(
                model="any",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=60,
                stream=True,
            )
            pieces: list[str] = []
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                    break
            server.send_signal()

            # A new connection for every probe: a kept-alive one could be answered by a
            # server that no longer accepts.
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True)
            ) as probes:

                async def refusing() -> bool:
                    return await server.health_status(probes) is None

                await _poll(refusing, "the server stops accepting connections")
            assert server.process.returncode is None  # still finishing the stream
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        assert "".join(pieces) == text_of(60)
        assert await server.wait_exit() == 0
    finally:
        await server.stop()


async def test_a_client_that_goes_away_frees_its_slot(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with run_fake_model(
        "--mode", "llamacpp", "-np", "1", "--tokens-per-second", "20",
        log_path=tmp_path / "fake.log",
    ) as server:  # fmt: skip
        url = f"{server.base_url}/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "stream": True}
        async with session.post(url, json=body) as response:
            assert response.status == 200
            await response.content.readline()
            response.close()

        async def idle() -> bool:
            slots = await _get_json(session, f"{server.base_url}/slots")
            return not any(slot["is_processing"] for slot in slots)

        # 200 tokens at 20/s would hold the slot for 10 s; the slot frees long before.
        await _poll(idle, "the abandoned stream's slot is free", limit=3.0)
        assert "client went away" in server.log()


async def test_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    async with run_fake_model(log_path=tmp_path / "first.log") as first:
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "e2e.fake_model", "--port", str(first.port),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=child_environment(None, first.host),
            cwd=REPO_ROOT,
        )  # fmt: skip
        async with asyncio.timeout(30):
            _, stderr = await second.communicate()
    assert second.returncode == 4
    assert f"cannot serve on 127.0.0.1:{first.port}" in stderr.decode()


async def test_an_injected_idle_probe_fault_fails_slots_and_metrics_until_cleared(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    async with run_fake_model("--mode", "llamacpp", log_path=tmp_path / "fake.log") as server:
        faults_url = f"{server.base_url}/fake/faults"
        async with session.put(faults_url, json={"idleProbe": "fail"}) as response:
            assert response.status == 200
        for path in ("/slots", "/metrics"):
            async with session.get(f"{server.base_url}{path}") as response:
                assert response.status == 500, path
        async with session.put(faults_url, json={"idleProbe": "sometimes"}) as response:
            assert response.status == 400
            assert "idleProbe" in (await response.json())["error"]["message"]
        async with session.put(faults_url, json={"idleProbe": "ok"}) as response:
            assert response.status == 200
        slots = await _get_json(session, f"{server.base_url}/slots")
        assert slots and not any(slot["is_processing"] for slot in slots)
