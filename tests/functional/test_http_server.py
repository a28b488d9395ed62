"""The router's own HTTP/1.1 server (`sidecar.http.server`) on a real socket, spoken to in
raw bytes and by aiohttp's client: pipelining, bodies over the limit refused unread,
`Expect: 100-continue`, a garbled request, chunked and close-delimited streams, a client
that leaves, idle keep-alive connections, a failing handler and a graceful shutdown.
Every test runs on asyncio's loop and on uvloop, whose transports differ."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import uvloop

from sidecar import dialects
from sidecar.http import server as http_server
from sidecar.http.messages import Reply, Request
from sidecar.http.server import Server

pytestmark = pytest.mark.functional

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
LIMIT = 1000


class Handlers:
    """Answers by path: /echo (the request as JSON), /stream (three chunks), /hold (until
    released or cancelled), /fail (raises), /slow (sleeps past any grace)."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.write_error: BaseException | None = None
        self.write_failed = asyncio.Event()

    async def __call__(self, request: Request, reply: Reply) -> None:
        if request.path == "/echo":
            body = json.dumps({"method": request.method, "target": request.target,
                               "path": request.path, "size": len(request.body),
                               "body": request.body.decode()}).encode()
            await reply.send(200, [("Content-Type", "application/json")], body)
        elif request.path == "/stream":
            await reply.start(200, [("Content-Type", "text/event-stream")])
            for i in range(3):
                await reply.write(f"data: {i}\n\n".encode())
            await reply.end()
        elif request.path == "/hold":
            self.entered.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            await reply.send(200, [], b"released")
        elif request.path == "/hold-then-write":
            await reply.start(200, [])
            self.entered.set()
            await self.release.wait()
            try:
                for _ in range(100):
                    await reply.write(b"x" * 65536)
            except BaseException as e:
                self.write_error = e
                self.write_failed.set()
                raise
        elif request.path == "/fail":
            raise RuntimeError("the handler broke")
        elif request.path == "/slow":
            self.entered.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        else:
            await reply.send(404, [], b"")


Check = Callable[[Server, Handlers], Awaitable[None]]


@asynccontextmanager
async def serving(keepalive: float = 75.0, read_timeout: float = 60.0
                  ) -> AsyncIterator[tuple[Server, Handlers]]:
    handlers = Handlers()
    server = Server(handlers, max_body=lambda: LIMIT, errors=dialects.SERVER_ERRORS,
                    keepalive_timeout=keepalive, read_timeout=read_timeout)
    await server.start("127.0.0.1", 0)
    try:
        yield server, handlers
    finally:
        await server.shutdown(0)


@pytest.fixture(params=sorted(LOOPS))
def on_loop(request: pytest.FixtureRequest) -> Callable[..., None]:
    def run(check: Check, **params: Any) -> None:
        async def main() -> None:
            try:
                async with asyncio.timeout(30), serving(**params) as (server, handlers):
                    await check(server, handlers)
            finally:
                while _WRITERS:
                    _WRITERS.pop().close()

        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            runner.run(main())

    return run


_WRITERS: list[asyncio.StreamWriter] = []  # the test's own connections, closed after it


async def raw(server: Server, data: bytes, *, then_read: bool = True
              ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Send `data` on a new connection; read until the server closes it (if `then_read`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    _WRITERS.append(writer)
    writer.write(data)
    await writer.drain()
    got = await reader.read() if then_read else b""
    return reader, writer, got


def answers(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split raw bytes holding answers with Content-Length into (status, headers, body)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers.get("content-length", len(rest)))
        out.append((status, headers, rest[:length]))
        data = rest[length:]
    return out


def post(path: str, body: bytes, *extra: bytes, version: bytes = b"1.1") -> bytes:
    return (b"POST %s HTTP/%s\r\nHost: x\r\n" % (path.encode(), version) + b"".join(extra)
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def test_pipelined_requests_are_answered_in_order(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        data = (post("/echo", b"one") + post("/echo", b"two")
                + post("/echo", b"three", b"Connection: close\r\n"))
        *_, got = await raw(server, data)
        bodies = [json.loads(body)["body"] for _, _, body in answers(got)]
        assert bodies == ["one", "two", "three"]

    on_loop(check)


def test_a_declared_body_over_the_limit_is_413_unread_and_the_connection_closes(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        # Only the head is sent: the answer comes without the body.
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (LIMIT + 1)
        *_, got = await raw(server, head)
        [(status, headers, body)] = answers(got)
        assert status == 413
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_too_large"

    on_loop(check)


def test_a_chunked_body_over_the_limit_is_413(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        chunk = b"x" * 600
        data = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                + (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 2 + b"0\r\n\r\n")
        *_, got = await raw(server, data)
        [(status, _, body)] = answers(got)
        assert status == 413, body

    on_loop(check)


def test_a_body_at_the_limit_is_served(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        *_, got = await raw(server, post("/echo", b"y" * LIMIT, b"Connection: close\r\n"))
        [(status, _, body)] = answers(got)
        assert status == 200
        assert json.loads(body)["size"] == LIMIT

    on_loop(check)


def test_expect_100_continue_is_answered_only_when_the_body_may_come(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        head = (b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                b"Connection: close\r\nContent-Length: 5\r\n\r\n")
        reader, writer, _ = await raw(server, head, then_read=False)
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        [(status, _, body)] = answers(await reader.read())
        assert (status, json.loads(body)["body"]) == (200, "hello")
        writer.close()

        too_big = (b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                   b"Content-Length: %d\r\n\r\n" % (LIMIT + 1))
        *_, got = await raw(server, too_big)
        assert not got.startswith(b"HTTP/1.1 100")
        assert answers(got)[0][0] == 413

    on_loop(check)


def test_a_garbled_request_is_400_in_openai_shape(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        *_, got = await raw(server, b"NOT HTTP AT ALL\r\n\r\n")
        [(status, headers, body)] = answers(got)
        assert status == 400
        assert headers["content-type"] == "application/json"
        assert "Malformed HTTP request" in json.loads(body)["error"]["message"]

    on_loop(check)


@pytest.mark.parametrize(("head", "why"), [
    (b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n", "request without Host"),
    (b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
     "more than one Host header"),
    (b"GET /echo HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", "more than one Host header"),
])
def test_host_headers_other_than_one_are_400(
    on_loop: Callable[..., None], head: bytes, why: str
) -> None:
    # RFC 9112, 3.2: a server must answer 400 to an HTTP/1.1 request without a Host header
    # and to any request with more than one.
    async def check(server: Server, handlers: Handlers) -> None:
        *_, got = await raw(server, head)
        [(status, _, body)] = answers(got)
        assert status == 400
        assert why in json.loads(body)["error"]["message"]
        *_, got = await raw(server, b"GET /echo HTTP/1.0\r\n\r\n")  # 1.0 may leave it out
        assert answers(got)[0][0] == 200

    on_loop(check)


@pytest.mark.parametrize("piece", [
    b"a" * 16384,  # one header line that never ends
    b"X-Many: 1\r\n" * 1000,  # headers that never end
])
def test_a_head_that_never_ends_is_431_and_read_no_further(
    on_loop: Callable[..., None], piece: bytes
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        reader, writer, _ = await raw(server, b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Long: ",
                                      then_read=False)

        async def send() -> None:
            for _ in range(4 * 1024 * 1024 // len(piece)):  # 64 times the limit
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0)

        sending = asyncio.create_task(send())
        async with asyncio.timeout(10):
            answer = await reader.readuntil(b"\r\n\r\n")
        sending.cancel()
        assert answer.startswith(b"HTTP/1.1 431 ")
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await sending

    on_loop(check)


READ_TIMEOUT = 0.3


async def _trickle(writer: asyncio.StreamWriter, pieces: list[bytes], pause: float) -> None:
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(pause)  # the pace of a slow client, not a synchronisation


@pytest.mark.parametrize(("pieces", "pause"), [
    # a head that stops coming
    ([b"GET /echo HTTP/1.1\r\nHost: x\r\n"], 0.0),
    # a head that comes a byte at a time, past the timeout in all (each byte in time)
    ([b"GET /echo HTTP/1.1\r\nHost: x\r\n"] + [b"X-Slow: 1\r\n"] * 100, READ_TIMEOUT / 5),
    # a body that stops coming
    ([b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf!"], 0.0),
])
def test_a_request_that_stalls_is_408_and_closed(
    on_loop: Callable[..., None], pieces: list[bytes], pause: float
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        reader, writer, _ = await raw(server, b"", then_read=False)
        trickling = asyncio.create_task(_trickle(writer, pieces, pause))
        got = await reader.read()  # until the server closes the connection
        trickling.cancel()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await trickling
        [(status, _, body)] = answers(got)
        assert status == 408
        assert json.loads(body)["error"]["code"] == "request_timeout"

    on_loop(check, read_timeout=READ_TIMEOUT)


def test_a_slow_body_that_keeps_coming_and_a_held_request_are_not_cut(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        # A body of 20 bytes, one every fifth of the timeout: four timeouts in all.
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n"
        reader, writer, _ = await raw(server, head, then_read=False)
        await _trickle(writer, [b"x"] * 20, READ_TIMEOUT / 5)
        [(status, _, body)] = answers(await reader.readuntil(b'"}'))
        assert (status, json.loads(body)["size"]) == (200, 20)
        # A request read whole and waiting for its answer is the handler's business.
        reader, writer, _ = await raw(
            server, b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            then_read=False)
        await handlers.entered.wait()
        await asyncio.sleep(READ_TIMEOUT * 3)  # an observation window: nothing may happen
        handlers.release.set()
        assert answers(await reader.read())[0][0] == 200

    on_loop(check, read_timeout=READ_TIMEOUT)


def test_a_refused_client_that_keeps_sending_still_reads_its_answer(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        body = b"x" * (4 * 1024 * 1024)
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        reader, writer, _ = await raw(server, head, then_read=False)
        sending = asyncio.create_task(_trickle(writer, [body[i:i + 65536] for i in
                                                        range(0, len(body), 65536)], 0.0))
        got = await reader.read()  # raises if the connection is reset before its end
        await sending  # and all of it could be sent: what came after the answer was read
        [(status, _, answer)] = answers(got)
        assert status == 413
        assert json.loads(answer)["error"]["code"] == "request_too_large"

    on_loop(check)


class _Transport:
    """What a connection of the server asks of its transport, recorded."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, data: Iterable[bytes]) -> None:
        for piece in data:
            self.write(piece)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def test_a_head_is_cut_within_one_read_past_the_limit() -> None:
    server = Server(Handlers(), max_body=lambda: LIMIT, errors=dialects.SERVER_ERRORS)
    connection = http_server._Connection(server)
    transport = _Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    piece = 8192
    # The read that begins the head is not counted, whatever its size.
    connection.data_received(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100_000)
    reads = 0
    while transport.reading:
        connection.data_received(b"a" * piece)
        reads += 1
        assert reads < 100
    assert reads == http_server.MAX_HEAD_BYTES // piece + 1
    await asyncio.sleep(0)  # the refusal is written by a task
    assert transport.written.startswith(b"HTTP/1.1 431 ")


def test_a_large_head_within_the_limit_is_served(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        value = b"v" * (http_server.MAX_HEAD_BYTES // 2)
        head = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\nConnection: close\r\n\r\n"
        *_, got = await raw(server, head % value)
        assert answers(got)[0][0] == 200

    on_loop(check)


def test_a_request_asking_to_upgrade_is_served_in_http11_with_its_body(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        upgrade = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AA\r\n"
        data = (post("/echo", b'{"model": "m"}', upgrade)
                + b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\n\r\n"
                + post("/echo", b"last", b"Connection: close\r\n"))
        *_, got = await raw(server, data)
        assert [(status, json.loads(body)["method"], json.loads(body)["body"])
                for status, _, body in answers(got)] == [
            (200, "POST", '{"model": "m"}'), (200, "GET", ""), (200, "POST", "last")]

    on_loop(check)


def test_streams_are_chunked_for_http11_and_close_delimited_for_http10(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        url = f"http://127.0.0.1:{server.port}/stream"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            assert resp.headers["Transfer-Encoding"] == "chunked"
            assert await resp.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        *_, got = await raw(server, b"GET /stream HTTP/1.0\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"chunked" not in head.lower()
        assert b"connection: close" in head.lower()
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"

    on_loop(check)


def test_a_client_that_leaves_cancels_its_handler(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        _, writer, _ = await raw(server, post("/hold", b""), then_read=False)
        await handlers.entered.wait()
        writer.close()
        await handlers.cancelled.wait()

    on_loop(check)


def test_writing_to_a_client_that_left_raises_connection_error(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        _, writer, _ = await raw(server, post("/hold-then-write", b""), then_read=False)
        await handlers.entered.wait()
        writer.transport.abort()
        # The handler is cancelled by the leaving, or its next write fails: either way it
        # cannot write into the void.
        handlers.release.set()
        await handlers.write_failed.wait()
        assert isinstance(handlers.write_error, (ConnectionError, asyncio.CancelledError))

    on_loop(check)


def test_an_idle_keepalive_connection_is_closed(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        reader, _, _ = await raw(server, post("/echo", b"a"), then_read=False)
        got = await reader.read()  # returns once the server closes the idle connection
        [(status, headers, _)] = answers(got)
        assert status == 200
        assert "connection" not in headers  # it was kept alive, then timed out

    on_loop(check, keepalive=0.2)


def test_a_failing_handler_is_answered_500_and_the_connection_closes(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        *_, got = await raw(server, post("/fail", b"") + post("/echo", b"never"))
        [(status, headers, body)] = answers(got)
        assert status == 500
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "internal_error"

    on_loop(check)


def test_shutdown_lets_a_request_finish_within_grace_and_closes_idle_connections(
    on_loop: Callable[..., None],
) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        idle_reader, _, _ = await raw(server, post("/echo", b"a"), then_read=False)
        await idle_reader.readuntil(b"\"a\"}")  # answered: the connection is idle now
        busy_reader, _, _ = await raw(server, post("/hold", b""), then_read=False)
        await handlers.entered.wait()
        shutting = asyncio.create_task(server.shutdown(30))
        assert await idle_reader.read() == b""  # closed at once
        handlers.release.set()
        got = await busy_reader.read()
        [(status, headers, body)] = answers(got)
        assert (status, body, headers["connection"]) == (200, b"released", "close")
        await shutting
        assert not handlers.cancelled.is_set()

    on_loop(check)


def test_shutdown_cancels_what_outlasts_the_grace(on_loop: Callable[..., None]) -> None:
    async def check(server: Server, handlers: Handlers) -> None:
        reader, _, _ = await raw(server, post("/slow", b""), then_read=False)
        await handlers.entered.wait()
        await server.shutdown(0.1)
        assert handlers.cancelled.is_set()
        assert await reader.read() == b""

    on_loop(check)
