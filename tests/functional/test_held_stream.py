"""A `stream: true` request held through a swap (sidecar.held_stream): its headers go out
at once, SSE comments keep it alive while it waits, the upstream's events follow in the
same response, and a failure after the headers is an OpenAI error event; the official
`openai` SDK reads all of it as usual. A request that is not streamed gets no early
answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from e2e.fake_model.harness import run_fake_model
from sidecar.app import Live, make_app
from sidecar.config import parse_config
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import (
    StandInActivation,
    config_json,
    serve_app,
    until,
    url_backend,
)

pytestmark = pytest.mark.functional

KEEPALIVE = 0.2
CHAT: Any = [{"role": "user", "content": "hello"}]


@asynccontextmanager
async def router_to(upstream_url: str, **settings: Any
                    ) -> AsyncIterator[tuple[str, StandInActivation]]:
    """The router with one pooled backend, `coder` (held until released), at `upstream_url`."""
    config = parse_config(config_json([url_backend("coder", upstream_url, pool="slot")],
                                      heldStreamKeepaliveSeconds=KEEPALIVE, **settings))
    metrics = RouterMetrics(CollectorRegistry(), "chat")
    activation = StandInActivation(config, metrics)
    async with serve_app(make_app(Live(config), activation, metrics)) as url:
        yield url, activation


@asynccontextmanager
async def fake_model(tmp_path: Path) -> AsyncIterator[str]:
    async with run_fake_model("--model", "/models/coder.gguf", "--alias", "coder",
                              "--tokens-per-second", "200",
                              log_path=tmp_path / "fake.log") as server:
        yield server.base_url


async def test_a_held_stream_starts_at_once_says_why_it_waits_and_then_streams(
    tmp_path: Path,
) -> None:
    async with fake_model(tmp_path) as upstream, router_to(upstream) as (url, activation), \
            aiohttp.ClientSession() as http:
        body = {"model": "coder", "messages": CHAT, "max_tokens": 4, "stream": True}
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            # the headers are here while the request is still held
            assert activation.held == 1
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            async with asyncio.timeout(10):
                comments = [await response.content.readline() for _ in range(4)]
            assert comments[1::2] == [b"\n", b"\n"]
            for line in comments[0::2]:
                assert line.startswith(b": loading coder, ") and \
                    line.endswith(b" s, held until release()\n"), line
            activation.release()
            rest = (await response.content.read()).decode()
    events = [line.removeprefix("data: ") for line in rest.splitlines()
              if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_the_sdk_reads_a_held_stream_as_usual(tmp_path: Path) -> None:
    async with fake_model(tmp_path) as upstream, router_to(upstream) as (url, activation), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model="coder", messages=CHAT, max_tokens=5,
                                                   stream=True)
        assert activation.held == 1  # the SDK has its response while the request is held
        await until(lambda: activation.progress_asked >= 3)
        activation.release()
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 3


async def test_a_request_that_is_not_streamed_gets_no_early_answer(tmp_path: Path) -> None:
    async with fake_model(tmp_path) as upstream, router_to(upstream) as (url, activation), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        plain = asyncio.create_task(
            sdk.chat.completions.create(model="coder", messages=CHAT, max_tokens=3))
        streamed = await sdk.chat.completions.create(model="coder", messages=CHAT,
                                                     max_tokens=3, stream=True)
        await until(lambda: activation.held == 2 and activation.progress_asked >= 3)
        assert not plain.done()  # held for as long, and nothing answered yet
        activation.release()
        reply = await plain
        async for _ in streamed:
            pass
    assert reply.choices[0].message.content


async def test_a_swap_abandoned_after_the_headers_is_an_error_event(tmp_path: Path) -> None:
    async with fake_model(tmp_path) as upstream, router_to(upstream) as (url, activation), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model="coder", messages=CHAT, max_tokens=3,
                                                   stream=True)
        await until(lambda: activation.progress_asked >= 1)
        await activation.shutdown(2.0)  # what a held request meets when the router stops
        with pytest.raises(openai.APIError) as raised:
            async for _ in stream:
                pass
    assert "shutting down" in raised.value.message


async def _error_event_after_hold(answer: web.Response) -> openai.APIError:
    """What the SDK raises for a held stream whose upstream then answers `answer`."""
    async def refuse(request: web.Request) -> web.Response:
        return answer

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    async with serve_app(app) as upstream:
        return await _error_event_from(upstream)


async def _error_event_from(upstream: str) -> openai.APIError:
    """What the SDK raises for a held stream, released to the upstream at `upstream`."""
    async with router_to(upstream) as (url, activation), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model="coder", messages=CHAT, stream=True)
        await until(lambda: activation.progress_asked >= 1)
        activation.release()
        with pytest.raises(openai.APIError) as raised:
            async for _ in stream:
                pass
    return raised.value


async def test_an_upstream_error_after_the_headers_is_an_error_event() -> None:
    error = await _error_event_after_hold(web.json_response(
        {"error": {"message": "the prompt is too long", "type": "invalid_request_error",
                   "code": "context_length_exceeded", "param": None}}, status=400))
    assert error.message == "the prompt is too long"


async def test_an_upstream_error_too_deep_to_parse_is_still_an_error_event() -> None:
    error = await _error_event_after_hold(web.Response(
        body=b"[" * 1_500 + b"]" * 1_500, status=502, content_type="application/json"))
    assert error.message.startswith("The backend answered 502: [[[")


async def test_an_upstream_error_that_breaks_off_is_still_an_error_event() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 100\r\n\r\n{\"error\"")
        writer.close()  # 10 of the 100 bytes its head promised

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        error = await _error_event_from(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    assert "400 answer broke off before its body was whole" in error.message


async def test_progress_as_content_is_what_a_chat_ui_shows(tmp_path: Path) -> None:
    async with fake_model(tmp_path) as upstream, \
            router_to(upstream, heldStreamProgress="content") as (url, activation), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model="coder", messages=CHAT, max_tokens=4,
                                                   stream=True)
        texts = []
        async for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "")
            if len(texts) == 2:
                activation.release()
        text = await sdk.completions.create(model="coder", prompt="hi", max_tokens=2,
                                            stream=True)  # released: no hold, no progress
        plain = [c.choices[0].text async for c in text]
    assert texts[0].startswith("loading coder, ") and texts[0].endswith("held until release()\n")
    assert texts[1].startswith("loading coder, ")
    assert "".join(texts[2:]) and not any(t.startswith("loading") for t in texts[2:])
    assert plain and not any(t.startswith("loading") for t in plain)
