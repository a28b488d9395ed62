"""The router's own HTTP/1.1 client (`sidecar.http.client.Client`) through the whole proxy,
against an upstream that writes raw bytes: keep-alive reuse, `Connection: close`, a body
that ends with its connection, interim 100 answers, bodies too large to pass whole, flow
control, a path prefix, a garbled answer and a read timeout mid-stream."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import uvloop
from prometheus_client import CollectorRegistry

from sidecar.app import Live, make_app
from sidecar.config import parse_config
from sidecar.http import client as upstream
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import StandInActivation, config_json, serve_app, url_backend

pytestmark = pytest.mark.functional


# Every test runs on both loops: the router runs on uvloop, whose transports differ.
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


OK = b'{"ok": true}'


def reply(body: bytes = OK, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(extra)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@dataclass
class Seen:
    connection: int
    head: bytes
    body: bytes


# What the raw upstream answers: the bytes to write, and whether to close afterwards.
Script = Callable[[Seen], tuple[bytes, bool]]


@dataclass
class RawUpstream:
    """Reads each request whole, records it, and writes whatever `script` says."""

    script: Script = lambda seen: (reply(), False)
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    handlers: set[asyncio.Task[Any]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                seen = Seen(number, head, await reader.readexactly(length))
                self.seen.append(seen)
                data, close = self.script(seen)
                writer.write(data)
                await writer.drain()
                if close:
                    return
        finally:
            writer.close()


@dataclass
class Proxy:
    url: str
    raw: RawUpstream
    registry: CollectorRegistry
    http: aiohttp.ClientSession
    client: upstream.Client

    async def post(self, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
        async with self.http.post(self.url + path, data=body) as resp:
            return resp.status, await resp.read()

    def errors(self, kind: str) -> float:
        labels = {"router": "chat", "backend": "raw", "kind": kind}
        value = self.registry.get_sample_value("modelpool_upstream_errors_total", labels)
        return 0.0 if value is None else value


BODY = json.dumps({"model": "raw"}).encode()


@asynccontextmanager
async def running_proxy(suffix: str = "", **params: Any) -> AsyncIterator[Proxy]:
    raw = RawUpstream()
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = parse_config(
        config_json([url_backend("raw", f"http://127.0.0.1:{port}{suffix}")], **params)
    )
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, "chat")
    app = make_app(Live(config), StandInActivation(config, metrics), metrics, connect_timeout=2)
    try:
        async with serve_app(app) as url, aiohttp.ClientSession() as http:
            yield Proxy(url, raw, registry, http, app.client)
    finally:
        server.close()
        # The router has closed its connections: every handler ends on its own.
        if raw.handlers:
            await asyncio.wait(raw.handlers, timeout=10)
        await server.wait_closed()


Check = Callable[[Proxy], Awaitable[None]]
OnLoop = Callable[..., None]


@pytest.fixture(params=sorted(LOOPS))
def on_loop(request: pytest.FixtureRequest) -> OnLoop:
    """Runs a check against a fresh proxy (config overrides as keywords) on one loop."""

    def run(check: Check, **params: Any) -> None:
        async def main() -> None:
            async with asyncio.timeout(60), running_proxy(**params) as proxy:
                await check(proxy)

        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            runner.run(main())

    return run


async def _until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    async with asyncio.timeout(limit):
        while not condition():  # noqa: ASYNC110 (a condition of the router's, no event)
            await asyncio.sleep(0.01)


def test_one_connection_serves_request_after_request(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        for _ in range(5):
            assert await proxy.post(BODY) == (200, OK)
        assert proxy.raw.connections == 1
        head = proxy.raw.seen[0].head
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        port = proxy.raw.seen[0].head.split(b"Host: 127.0.0.1:")[1].split(b"\r\n")[0]
        assert port.isdigit()
        assert proxy.raw.seen[0].body == BODY

    on_loop(check)


def test_connection_close_is_honoured(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = lambda seen: (reply(OK, b"Connection: close\r\n"), True)
        for _ in range(3):
            assert await proxy.post(BODY) == (200, OK)
        assert proxy.raw.connections == 3
        assert proxy.client.idle() == 0

    on_loop(check)


def test_a_connection_the_upstream_closed_while_idle_is_not_reused(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = lambda seen: (reply(), True)  # closes without saying so
        assert await proxy.post(BODY) == (200, OK)
        await _until(lambda: proxy.client.idle() == 0)
        assert await proxy.post(BODY) == (200, OK)
        assert proxy.raw.connections == 2

    on_loop(check)


def test_a_body_without_length_ends_with_its_connection(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = lambda seen: (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", True)
        assert await proxy.post(BODY) == (200, b"until the end")
        assert await proxy.post(BODY) == (200, b"until the end")
        assert proxy.raw.connections == 2

    on_loop(check)


def test_an_interim_100_answer_is_skipped(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = lambda seen: (b"HTTP/1.1 100 Continue\r\n\r\n" + reply(), False)
        assert await proxy.post(BODY) == (200, OK)
        assert await proxy.post(BODY) == (200, OK)
        assert proxy.raw.connections == 1

    on_loop(check)


def test_a_garbled_answer_is_502(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = lambda seen: (b"SPDY/9 what\r\n\r\n", True)
        status, body = await proxy.post(BODY)
        assert status == 502
        assert json.loads(body)["error"]["code"] == "upstream_failed"
        assert proxy.errors("disconnect") == 1

    on_loop(check)


def test_an_answer_whose_head_never_ends_is_502(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        # One header line of 1 MiB, unfinished, on a connection left open: it is cut past
        # the limit, not kept until the read timeout.
        proxy.raw.script = lambda seen: (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (1 << 20), False)
        status, body = await proxy.post(BODY)
        assert status == 502
        error = json.loads(body)["error"]
        assert error["code"] == "upstream_failed"
        assert str(upstream.MAX_ANSWER_HEAD_BYTES) in error["message"]

    on_loop(check, responseHeaderTimeoutSeconds=600)


@pytest.mark.parametrize(("close", "status", "code", "kind"), [
    (True, 502, "upstream_failed", "disconnect"),  # the connection closes
    (False, 504, "upstream_timeout", "timeout"),  # the rest never comes
])
def test_an_answer_that_breaks_off_before_its_body_is_whole_is_an_error_answer(
    on_loop: OnLoop, close: bool, status: int, code: str, kind: str
) -> None:
    async def check(proxy: Proxy) -> None:
        # A head that promises 100 bytes, then 9 of them. Nothing has gone to the client,
        # so it is answered, not left with a closed connection.
        proxy.raw.script = lambda seen: (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"id\": 1,", close)
        answered, body = await proxy.post(BODY)
        assert answered == status
        error = json.loads(body)["error"]
        assert error["code"] == code
        if close:
            assert "200 answer broke off before its body was whole" in error["message"]
        assert proxy.errors(kind) == 1
        proxy.raw.script = lambda seen: (reply(), False)
        assert await proxy.post(BODY) == (200, OK)

    on_loop(check, responseHeaderTimeoutSeconds=0.3)


def test_large_bodies_pass_unchanged_both_ways(
    on_loop: OnLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def check(proxy: Proxy) -> None:
        monkeypatch.setattr(upstream, "_PAUSE_BYTES", 4096)  # so the upstream is surely paused
        big = json.dumps({"model": "raw", "pad": "x" * 300_000}).encode()
        answer = bytes(range(256)) * 4096  # 1 MiB: streamed, not read whole
        chunked = b"".join(
            b"%x\r\n%s\r\n" % (len(piece), piece)
            for piece in (answer[i : i + 100_000] for i in range(0, len(answer), 100_000))
        )
        scripts = [
            lambda seen: (reply(answer), False),
            lambda seen: (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n",
                False,
            ),
        ]
        for script in scripts:
            proxy.raw.script = script
            async with proxy.http.post(proxy.url + "/v1/chat/completions", data=big) as resp:
                assert resp.status == 200
                received = b""
                async for chunk in resp.content.iter_any():
                    received += chunk
                    await asyncio.sleep(0)  # a slow reader: the router must pause the upstream
            assert received == answer
            assert proxy.raw.seen[-1].body == big
        assert proxy.raw.connections == 1

    on_loop(check, maxBodyBytes=1 << 20)


def test_the_base_url_path_and_the_query_are_kept(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        assert await proxy.post(BODY, path="/v1/completions?a=1&b=x%20y") == (200, OK)
        assert proxy.raw.seen[0].head.startswith(b"POST /prefix/v1/completions?a=1&b=x%20y ")

    on_loop(check, suffix="/prefix/")


def test_a_stream_that_stalls_past_the_read_timeout_is_cut(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = lambda seen: (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n",
            False,
        )
        with pytest.raises(aiohttp.ClientPayloadError):
            await proxy.post(BODY)
        await _until(lambda: proxy.errors("timeout") == 1)

    on_loop(check, responseHeaderTimeoutSeconds=0.3)


def test_an_absolute_form_target_is_sent_on_as_path_and_query(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        host = proxy.url.removeprefix("http://")
        reader, writer = await asyncio.open_connection(*host.split(":"))
        writer.write(
            b"POST %s/v1/completions?a=1 HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (proxy.url.encode(), host.encode(), len(BODY), BODY)
        )
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
        assert proxy.raw.seen[0].head.startswith(b"POST /v1/completions?a=1 HTTP/1.1\r\n")

    on_loop(check)


def answer_once_then(raw: RawUpstream, last_words: bytes) -> Script:
    """Answers the first request; after it, writes `last_words` and closes the connection."""
    return lambda seen: (reply(), False) if len(raw.seen) == 1 else (last_words, True)


def test_a_pooled_connection_closed_unanswered_is_replaced_by_a_new_one(
    on_loop: OnLoop,
) -> None:
    async def check(proxy: Proxy) -> None:
        # The first connection answers once, then closes on the next request unanswered.
        proxy.raw.script = lambda seen: (
            (reply(), False) if seen.connection > 1 or len(proxy.raw.seen) == 1 else (b"", True)
        )
        assert await proxy.post(BODY) == (200, OK)
        assert await proxy.post(BODY) == (200, OK)
        assert [s.connection for s in proxy.raw.seen] == [1, 1, 2]
        assert [s.body for s in proxy.raw.seen] == [BODY] * 3
        assert proxy.errors("disconnect") == 0

    on_loop(check)


def test_a_request_is_sent_again_only_once_and_never_after_a_new_connection_failed(
    on_loop: OnLoop,
) -> None:
    async def check(proxy: Proxy) -> None:
        # After the first answer every request is read and its connection closed.
        proxy.raw.script = answer_once_then(proxy.raw, b"")
        assert await proxy.post(BODY) == (200, OK)
        status, body = await proxy.post(BODY)
        assert status == 502, body
        # On the pooled connection, then once on a new one: no more.
        assert [s.connection for s in proxy.raw.seen] == [1, 1, 2]
        # A new connection closed unanswered is not sent again.
        status, _ = await proxy.post(BODY)
        assert status == 502
        # (Connection 3 was the router's check that the server still accepts connections.)
        assert [s.connection for s in proxy.raw.seen] == [1, 1, 2, 4]
        assert proxy.errors("disconnect") == 2

    on_loop(check)


def test_a_pooled_connection_that_broke_mid_answer_is_not_sent_again(on_loop: OnLoop) -> None:
    async def check(proxy: Proxy) -> None:
        proxy.raw.script = answer_once_then(proxy.raw, b"HTTP/1.1 200 OK\r\nContent-Le")
        assert await proxy.post(BODY) == (200, OK)
        status, _ = await proxy.post(BODY)
        assert status == 502
        assert [s.connection for s in proxy.raw.seen] == [1, 1]

    on_loop(check)


# Answers a model server might send, whole, for the fuzzed test below to cut and garble.
_EVENT = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
_ANSWERS = (
    reply(),
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (_EVENT, _EVENT, b"data: [DONE]\n\n"))
    + b"0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + _EVENT * 3,
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 27\r\n\r\n"
    b'{"error": {"message": "x"}}',
    b"HTTP/1.1 100 Continue\r\n\r\n" + reply(),
    b"HTTP/1.0 200 OK\r\n\r\n" + OK,
    b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + b"x" * 70000,
)
_INSERTS = (b"\r\n", b":", b" ", b"\x00", b"\xff", b"\n", b"Transfer-Encoding: chunked\r\n",
            b"Content-Length: 3\r\n", b"Content-Length: 99999999999999999999\r\n",
            b"Connection: close\r\n", b"HTTP/1.1 200 OK\r\n", b"ffffffffffffffff\r\n")


def _garbled(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(0, 3)):
        at = rng.randrange(len(out) + 1)
        op = rng.random()
        if op < 0.3 and at < len(out):
            out[at] = rng.randrange(256)
        elif op < 0.5:
            del out[at:at + rng.randint(1, 8)]
        elif op < 0.8:
            out[at:at] = rng.choice(_INSERTS)
        else:
            del out[at:]
    return bytes(out)


def _scripted(answer: tuple[bytes, bool], seen: Seen) -> tuple[bytes, bool]:
    return answer


def test_garbled_and_cut_answers_each_get_an_end_and_the_router_goes_on(
    on_loop: OnLoop, caplog: pytest.LogCaptureFixture
) -> None:
    """A fixed sample of answers cut, garbled and closed early or left open: each request
    ends (answered, or its connection closed once a body was under way), none is the
    router's own 500, nothing is logged as an error, and a good answer still passes
    whole afterwards."""
    rng = random.Random(7)
    cases = [(_garbled(rng, rng.choice(_ANSWERS)), rng.random() < 0.5) for _ in range(120)]

    async def check(proxy: Proxy) -> None:
        for case in cases:
            proxy.raw.script = functools.partial(_scripted, case)
            try:
                async with asyncio.timeout(10):
                    _status, body = await proxy.post(BODY)
            except aiohttp.ClientError:
                continue  # cut after its head went out, as it should be
            assert b"Internal router error" not in body, case
        proxy.raw.script = lambda seen: (reply(), False)
        assert await proxy.post(BODY) == (200, OK)

    with caplog.at_level(logging.ERROR):
        on_loop(check, responseHeaderTimeoutSeconds=0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
