"""The fake model server in llama.cpp mode held to a real `llama-server`: one suite, run
against both, for every answer the project relies on (readiness, the idle probe's
`/slots`, the OpenAI endpoints, streaming, errors). The real server is built by
e2e/llama/build-llama-server.sh (the README's test command runs it) and serves a tiny
model generated here (e2e/llama/models.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.fake_model.harness import free_port, run_fake_model
from e2e.llama import models
from e2e.local.paths import REPO_ROOT

pytestmark = [pytest.mark.functional, pytest.mark.build("llama-server")]

BUILD = REPO_ROOT / "e2e" / "llama" / "build-llama-server.sh"
SLOTS = 2
NAME = "gemma"


@dataclass(frozen=True)
class Server:
    kind: str
    base_url: str
    model_arg: str

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"


def llama_server_binary() -> Path:
    """The binary the build script made; this suite never builds it (minutes)."""
    result = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True,
                            timeout=60, check=False,
                            env={**os.environ, "MODELPOOL_LLAMA_NO_BUILD": "1"})
    assert result.returncode == 0, f"no llama-server built: run {BUILD} (scripts/test does)"
    return Path(result.stdout.strip().splitlines()[-1])


async def _healthy(url: str, process: asyncio.subprocess.Process | None) -> None:
    """`/health` 200, then `GET /slots` answered: llama-server starts its task loop (which
    answers `/slots`) after its first 200, and loses a SIGTERM that lands before that start
    (benchmarks/gpu/server.py), so a server stopped at once would run on."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            if process is not None and process.returncode is not None:
                raise AssertionError(f"llama-server exited {process.returncode}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        async with http.get(url + "/slots") as slots:
                            assert slots.status == 200, f"{url}/slots: {slots.status}"
                        return
            await asyncio.sleep(0.05)  # polling a server's start: there is no event to wait on
    raise AssertionError(f"{url} never answered /health 200")


@contextlib.asynccontextmanager
async def real_server(model: Path, log: Path, extra: Sequence[str] = ()) -> AsyncIterator[Server]:
    binary = llama_server_binary()
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", str(SLOTS), "--metrics", *extra, stdout=out,
            stderr=subprocess.STDOUT)
    try:
        await _healthy(f"http://127.0.0.1:{port}", process)
        yield Server("real", f"http://127.0.0.1:{port}", str(model))
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


@contextlib.asynccontextmanager
async def started(kind: str, where: Path, extra: Sequence[str] = ()) -> AsyncIterator[Server]:
    """The real llama-server or the fake in llama.cpp mode, serving a model written in
    `where`, with `extra` arguments for both."""
    model = models.write_model(where / "models", NAME)
    if kind == "real":
        async with real_server(model, where / "llama-server.log", extra) as real:
            yield real
        return
    async with run_fake_model("--mode", "llamacpp", "--model", str(model), "-c", "2048",
                              "-np", str(SLOTS), "--tokens-per-second", "5000", *extra,
                              log_path=where / "fake.log") as fake:
        await _healthy(fake.base_url, None)
        yield Server("fake", fake.base_url, str(model))


@pytest.fixture(params=["fake", "real"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Server]:
    async with started(request.param, tmp_path) as running:
        yield running


def client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                              timeout=60)


async def get_json(url: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.json(content_type=None)


async def test_health_is_200_ok_once_loaded(server: Server) -> None:
    status, body = await get_json(server.base_url + "/health")
    assert (status, body) == (200, {"status": "ok"})


async def test_slots_list_each_slot_idle_when_nothing_runs(server: Server) -> None:
    status, body = await get_json(server.base_url + "/slots")
    assert status == 200 and isinstance(body, list) and len(body) == SLOTS, body
    for slot in body:
        assert isinstance(slot["id"], int) and slot["is_processing"] is False, slot


async def test_a_slot_is_processing_while_a_generation_runs(server: Server) -> None:
    """What the idle probe reads to keep a busy incumbent resident: a slot processing while
    a generation streams, and every slot idle again once its client has gone. The client
    leaves after the first reading that shows it (the server stops a generation whose
    client is gone), so the test never waits for 1,500 tokens on a starved host."""
    seen = False
    async with client(server) as c:
        stream = await c.completions.create(
            model=NAME, prompt="the pool", max_tokens=1500, stream=True)
        async for _chunk in stream:  # a chunk came: the generation runs
            _, slots = await get_json(server.base_url + "/slots")
            assert isinstance(slots, list)
            seen = any(s["is_processing"] for s in slots)
            if seen:
                break
        await stream.close()
    assert seen, "no slot ever read as processing while a 1500-token generation streamed"
    assert await all_slots_idle(server), "a slot still processes after its client went"


async def all_slots_idle(server: Server, tries: int = 600) -> bool:
    """Whether `/slots` reads every slot idle within `tries` readings, 0.1 s apart."""
    for _ in range(tries):
        _, slots = await get_json(server.base_url + "/slots")
        if isinstance(slots, list) and not any(s["is_processing"] for s in slots):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_requests_queued_behind_busy_slots_keep_a_slot_processing(server: Server) -> None:
    """More generations than slots: the extra one waits in the server's queue, which `/slots`
    does not list; the drain is safe only if the probe never finds the server idle while a
    request is still to be generated. The probe takes two readings of idle in a row as idle
    (llama.cpp can answer one between freeing a slot and handing it the queued request:
    seen once in 1,234 readings on a loaded host). Two idle readings followed by a busy one
    are that gap; idle after the last
    generation, before its reply reaches the client, is not. Readings count only once the
    server says a request waits (`requests_deferred`): a request that reached it after a
    slot was free again never waited, and an attempt where none waited is made again, as is
    one whose generations ended before ten readings (a starved host reads slowly)."""
    for _attempt in range(10):
        async with client(server) as c:
            running = [asyncio.create_task(c.completions.create(
                model=NAME, prompt="the pool", max_tokens=600)) for _ in range(SLOTS + 1)]
            busy: list[bool] = []
            queued = False
            while not all(task.done() for task in running):
                if not queued:
                    queued = await deferred(server) > 0
                    continue
                _, slots = await get_json(server.base_url + "/slots")
                assert isinstance(slots, list)
                busy.append(any(s["is_processing"] for s in slots))
            replies = await asyncio.gather(*running)
        assert [r.usage.completion_tokens if r.usage else None for r in replies] == [600] * 3
        if queued and len(busy) > 10:
            break
    assert queued, "in 10 attempts no request ever waited for a slot"
    assert len(busy) > 10, f"only {len(busy)} samples: the generations ended too soon to judge"
    pairs = [i for i in range(len(busy) - 1) if not busy[i] and not busy[i + 1]]
    first_idle = pairs[0] if pairs else len(busy)
    assert not any(busy[first_idle:]), (
        f"samples {first_idle} and {first_idle + 1} of {len(busy)} read idle while a "
        "queued request waited")


async def deferred(server: Server) -> float:
    """`llamacpp:requests_deferred` from the server's /metrics (Prometheus' own parser)."""
    async with aiohttp.ClientSession() as http, http.get(server.base_url + "/metrics") as r:
        assert r.status == 200, r.status
        text = await r.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "llamacpp:requests_deferred":
                return sample.value
    raise AssertionError("no llamacpp:requests_deferred in /metrics")


def _tasks(slots: object) -> list[object]:
    assert isinstance(slots, list)
    return [slot.get("id_task") for slot in slots]


async def test_a_slots_task_id_changes_with_each_generation_and_nothing_else(
    server: Server,
) -> None:
    """What `spec.idleUnloadAfter` reads as "served something": a slot shows the id of its
    last task, every generation is a new task, and reading `/slots`, `/health` or
    `/v1/models` is none."""
    _, before = await get_json(server.base_url + "/slots")
    for path in ("/health", "/v1/models", "/slots"):
        await get_json(server.base_url + path)
    _, after_reads = await get_json(server.base_url + "/slots")
    assert _tasks(after_reads) == _tasks(before)
    marks = [_tasks(after_reads)]
    async with client(server) as c:
        for _ in range(3):
            await c.completions.create(model=NAME, prompt="the pool", max_tokens=4)
            _, slots = await get_json(server.base_url + "/slots")
            marks.append(_tasks(slots))
    assert len({json.dumps(m) for m in marks}) == 4, marks
    assert all(isinstance(t, int) for t in marks[-1] if t is not None), marks


async def test_chat_completion_runs_to_max_tokens(server: Server) -> None:
    async with client(server) as c:
        reply = await c.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert reply.object == "chat.completion"
    (choice,) = reply.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 8


async def test_completion_runs_to_max_tokens(server: Server) -> None:
    async with client(server) as c:
        reply = await c.completions.create(model=NAME, prompt="the pool", max_tokens=6)
    assert reply.object == "text_completion"
    assert reply.choices[0].text and reply.choices[0].finish_reason == "length"


async def test_chat_streams_chunks_and_ends_with_done(server: Server) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "stream": True}
    async with aiohttp.ClientSession() as http, http.post(
            server.openai_url + "/chat/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = (await r.read()).decode()
    frames = [f for f in text.split("\n\n") if f.strip()]
    assert frames[-1] == "data: [DONE]", frames[-3:]
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


async def test_bad_json_is_an_openai_400(server: Server) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            server.openai_url + "/chat/completions", data=b"{not json",
            headers={"Content-Type": "application/json"}) as r:
        status, body = r.status, await r.json(content_type=None)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error", body


async def test_a_prompt_over_the_context_is_a_400(server: Server) -> None:
    """The router passes this through unchanged: the client sees the server's own 400."""
    prompt = "the pool " * 3000
    async with client(server) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.completions.create(model=NAME, prompt=prompt, max_tokens=4)
    assert caught.value.status_code == 400


async def test_models_name_the_model_as_it_was_given(server: Server) -> None:
    status, body = await get_json(server.openai_url + "/models")
    assert status == 200 and isinstance(body, dict)
    assert [m["id"] for m in body["data"]] == [server.model_arg], body


def test_the_build_script_pins_its_version() -> None:
    text = BUILD.read_text()
    assert 'VERSION=11434.0.0' in text and os.access(BUILD, os.X_OK)
