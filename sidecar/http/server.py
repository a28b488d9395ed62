"""The router's own HTTP/1.1 server, for its API port.

aiohttp's server cost the router about as much CPU per proxied request as everything
else it does (request and response objects, a task per connection and one per request,
its stream reader and writer; docs/benchmarks.md). What the API port needs is small:
parse a request with `httptools` (llhttp, C), hand its whole body to one handler, and
write the answer whole or streamed. Everything else is the router's business:

- **one request at a time per connection**: pipelined requests queue and are answered in
  order; past `_MAX_QUEUED` reading pauses;
- **bodies are read whole before the handler runs**, up to `max_body()` bytes: a
  `Content-Length` over it is answered 413 at once, unread, and the connection closes;
  `Expect: 100-continue` is answered `100 Continue` only when the body may come;
- **a client that leaves cancels its handler** (a held request gives up its place). A
  client's end of input is taken for leaving, as a closed socket and a half-closed one
  look the same until something is written;
- a request that asks to upgrade (`Upgrade: h2c`, a websocket) is served in HTTP/1.1,
  the upgrade ignored;
- a request line and headers over `MAX_HEAD_BYTES` are a 431, read no further; a head not
  whole within `read_timeout` of its first byte, or a body that pauses longer, is a 408
  (a slow client cannot hold a connection for ever);
- a request with more than one `Host` header, or an HTTP/1.1 one with none, is a 400
  (RFC 9112, 3.2), as nginx and HAProxy answer it;
- answers of known length go out as one write; streamed ones use chunked transfer
  coding (close-delimited for an HTTP/1.0 client); writing waits while the client's
  socket buffer is full;
- idle keep-alive connections close after `keepalive_timeout` seconds (within a quarter
  of it more: one sweep serves every connection);
- `drain()` closes each connection after its answer, still accepting new ones;
  `shutdown(grace)` stops accepting, closes idle connections, lets handlers finish within
  `grace`, then cancels them.

Errors the server answers itself (a garbled request, a body too large, a handler that
failed before answering) are written by the `ErrorAnswers` it is given, in the caller's
vocabulary (the router's, in the dialect of the path asked for, are
`sidecar.dialects.SERVER_ERRORS`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import httptools

from sidecar.http.messages import Answer, Reply, Request

logger = logging.getLogger(__name__)

# The most a request's line and headers may take (nginx allows 32 KiB, aiohttp 8 KiB a
# line); past it the answer is 431 and the connection closes.
MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_SECONDS = 75.0  # aiohttp's default, which clients and proxies have met so far
# A request's head must come whole within this of its first byte, and its body must not
# pause longer (nginx's client_header_timeout and client_body_timeout); else 408.
READ_TIMEOUT_SECONDS = 60.0
# How long a refused connection reads and drops what its client still sends (`_linger`).
LINGER_SECONDS = 2.0
# Pipelined requests waiting for their turn before the server stops reading.
_MAX_QUEUED = 8


class ErrorAnswers(Protocol):
    """The answers the server gives itself, in its caller's error vocabulary."""

    def malformed(self, detail: str) -> Answer: ...

    def too_large(self, limit: int, target: str) -> Answer:
        """A body over `limit` bytes, sent to `target` (its path says the dialect)."""
        ...

    def head_too_large(self, limit: int) -> Answer: ...

    def request_timeout(self, seconds: float) -> Answer: ...

    def internal(self) -> Answer: ...


class Refusal:
    """A request answered by the server itself, after which the connection closes."""

    __slots__ = ("answer",)

    def __init__(self, answer: Answer) -> None:
        self.answer = answer


Handler = Callable[[Request, Reply], Awaitable[None]]


class _Connection(asyncio.Protocol):
    """One client connection: its parser, its queue of requests, the handler answering."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._queue: collections.deque[Request | Refusal] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # close once the answer being written is out
        self._deaf = False  # input after a refusal is not read
        self._reading_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._writing_paused = False
        # Called once when the client's socket takes writes again (`Reply.write_nowait`).
        self.on_writable: Callable[[], None] | None = None
        # Since when the connection waits for a request (None while one is in): the
        # server's sweep closes it past the keep-alive timeout.
        self.idle_since: float | None = None
        # Since when the request being read has waited for its client (None between
        # requests, and for one read whole in one read): the read that began its head
        # while the head is read, then its body's last read.
        self.reading_since: float | None = None
        self.http11_client = True
        self._in_message = False
        # The request head being read: its number on this connection, and its bytes
        # beyond the read that began it (None between heads).
        self._heads = 0
        self._head: int | None = None
        # A request that asked to upgrade, whose body is still to come: (request, the
        # body's parts so far, bytes still needed).
        self._upgrading: tuple[Request, list[bytes], int] | None = None
        self._message_begun()

    def _message_begun(self) -> None:
        self._url: list[bytes] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._limit = 0
        self._length = 0  # as the head announced
        self._refused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        self.idle_since = self._loop.time()

    def data_received(self, data: bytes) -> None:
        if self._deaf:
            return
        if self._upgrading is not None:
            data = self._upgrade_body(data)
            if not data:
                return
        head = self._heads if self._head is not None else -1
        try:
            self._parser.feed_data(data)
            if self._in_message and (self._head is None or self.reading_since is None):
                # A request still to come whole: its head's first read, or its body's last.
                # (A request read whole in one read, the usual case, needs no clock.)
                self.reading_since = self._loop.time()
            if self._head is not None and self._heads == head:
                # The same head, still unfinished, took all of this read. httptools keeps
                # a header line until it ends, so this is where a head that never ends
                # is caught. A head may pass the limit by at most the read that began it
                # (which is not counted: where in it the head began is not known).
                self._head += len(data)
                if self._head > MAX_HEAD_BYTES:
                    self._refuse(self._server.errors.head_too_large(MAX_HEAD_BYTES))
        except httptools.HttpParserUpgrade as e:
            # llhttp ends a request that asks to upgrade (`Upgrade: h2c`, a websocket) at
            # its head. The router ignores the upgrade, as RFC 9110 section 7.8 lets a
            # server: it reads the body the head announced and goes on in HTTP/1.1.
            self._parser = httptools.HttpRequestParser(self)
            rest = data[int(e.args[0]):]
            if rest:
                self.data_received(rest)
        except httptools.HttpParserError as e:
            self._refuse(self._server.errors.malformed(str(e)))

    def _upgrade_body(self, data: bytes) -> bytes:
        """Feed the body of a request that asked to upgrade; what follows it is returned."""
        assert self._upgrading is not None
        request, parts, needed = self._upgrading
        parts.append(data[:needed])
        rest = data[needed:]
        needed -= len(parts[-1])
        if needed:
            self._upgrading = request, parts, needed
            return b""
        self._upgrading = None
        request.body = b"".join(parts)
        self._queue.append(request)
        self._next()
        return rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._server.connections.discard(self)
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()  # the client left: its handler stops where it is
        self._wake_writer(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer(None)
        writable, self.on_writable = self.on_writable, None
        if writable is not None:
            writable()

    @property
    def writing_paused(self) -> bool:
        return self._writing_paused

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._message_begun()
        self._in_message = True
        self._heads += 1
        self._head = 0
        self.idle_since = None

    def on_url(self, url: bytes) -> None:
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head = None
        limit = self._limit = self._server.max_body()
        length = expect = None
        chunked = False
        hosts = 0
        for name, value in self._headers:
            size = len(name)  # lower-case only the names that may be one of these
            if size == 4 and name.lower() == b"host":
                hosts += 1
            elif size == 14 and name.lower() == b"content-length":
                length = int(value)  # llhttp has checked it
            elif size == 6 and name.lower() == b"expect":
                expect = value.lower()
            elif size == 17 and name.lower() == b"transfer-encoding":
                chunked = True
        self._length = length or 0
        # RFC 9112, 3.2: exactly one Host header in HTTP/1.1, at most one before it.
        if hosts != 1 and (hosts or self._parser.get_http_version() == "1.1"):
            why = "more than one Host header" if hosts else "an HTTP/1.1 request without Host"
            self._refuse(self._server.errors.malformed(why))
            return
        if chunked and self._parser.should_upgrade():
            self._refuse(self._server.errors.malformed(
                "a request that asks to upgrade cannot have a chunked body"))
            return
        if length is not None and length > limit:
            self._refuse(self._server.errors.too_large(limit, self._target()))
            return
        if expect == b"100-continue" and self._task is None and not self._queue:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._size += len(body)
        if self._size > self._limit:
            self._refuse(self._server.errors.too_large(self._limit, self._target()))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self.reading_since = None
        if self._refused:
            return
        parser = self._parser
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.http11_client = parser.get_http_version() == "1.1"
        request = Request(
            parser.get_method().decode("ascii", "replace"),
            b"".join(self._url).decode("utf-8", "surrogateescape"),
            self._headers, body, parser.should_keep_alive(),
        )
        if parser.should_upgrade() and self._length and not body:
            self._upgrading = request, [], self._length  # its body follows (data_received)
            return
        self._queue.append(request)
        self._next()

    def _target(self) -> str:
        return b"".join(self._url).decode("utf-8", "surrogateescape")

    # answering

    def _refuse(self, answer: Answer) -> None:
        """Answer `answer` in turn, read nothing more, and close after it."""
        self._refused = True
        self._deaf = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._queue.append(Refusal(answer))
        self._next()

    def _next(self) -> None:
        if self._task is not None or not self._queue or self.transport is None:
            if len(self._queue) > _MAX_QUEUED and not self._reading_paused and self.transport:
                self._reading_paused = True
                self.transport.pause_reading()
            return
        item = self._queue.popleft()
        self._task = self._loop.create_task(self._answer(item))

    async def _answer(self, item: Request | Refusal) -> None:
        if isinstance(item, Refusal):
            reply = Reply(self, keep_alive=False)
            await _quietly(reply.send(*item.answer))
        else:
            reply = Reply(self, keep_alive=item.keep_alive and not self._closing
                          and not self._server.stopping)
            try:
                await self._server.handler(item, reply)
            except asyncio.CancelledError:
                reply.keep_alive = False
            except ConnectionError:
                reply.keep_alive = False
            except Exception:
                logger.exception("handler failed for %s %s", item.method, item.path)
                reply.keep_alive = False
                if not reply.started:
                    await _quietly(reply.send(*self._server.errors.internal()))
            if not reply.done:
                reply.keep_alive = False  # an answer cut short (or none at all)
        self._task = None
        if self.transport is None:
            return
        if isinstance(item, Refusal):
            self._linger()
            return
        if not reply.keep_alive or self._closing or self._server.stopping:
            self.transport.close()
            return
        if self._reading_paused and len(self._queue) <= _MAX_QUEUED // 2:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._queue:
            self._next()
        elif self._parser_idle():
            self.idle_since = self._loop.time()

    def _linger(self) -> None:
        """Close after a refusal without losing its answer. A client refused mid-request
        may still be sending; closing a socket with unread input resets the connection,
        and the reset can reach the client before it has read the answer. So: the answer,
        then end of output; input is read and dropped until the client closes, or for
        `LINGER_SECONDS` at most (nginx's lingering close)."""
        transport = self.transport
        assert transport is not None
        try:
            transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            transport.close()
            return
        transport.resume_reading()  # into data_received, which drops it (`_deaf`)
        self._loop.call_later(LINGER_SECONDS, transport.close)

    async def write(self, *data: bytes) -> None:
        """`data` to the client, once its socket buffer can take more."""
        self.put(*data)
        if self._writing_paused:
            await self.drained()

    def put(self, *data: bytes) -> None:
        """`data` to the client's transport, however full its buffer already is; raises
        ConnectionResetError if the client is gone, even with nothing to write."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if len(data) == 1:
            if data[0]:
                transport.write(data[0])
        else:
            transport.writelines(data)

    async def drained(self) -> None:
        """Until the client's socket buffer takes writes again."""
        if self._writing_paused:
            waiter = self._drain = self._loop.create_future()
            await waiter

    def _wake_writer(self, error: Exception | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close_if_idle(self) -> None:
        """Close now if nothing is being answered; otherwise once it is."""
        self._closing = True
        if self._task is None and self.transport is not None:
            self.transport.close()

    def _parser_idle(self) -> bool:
        """Whether no request has begun since the last one ended."""
        return not self._in_message

    def close_when_idle_since(self, deadline: float) -> None:
        if (self.idle_since is not None and self.idle_since < deadline
                and self._task is None and not self._queue and self.transport is not None):
            self.transport.close()

    def refuse_if_stalled_since(self, deadline: float, timeout: float) -> None:
        """Answer 408 and close if the request being read has waited for its client since
        before `deadline` (not while the server itself stopped reading)."""
        if (self.reading_since is not None and self.reading_since < deadline
                and not self._deaf and not self._reading_paused):
            self._refuse(self._server.errors.request_timeout(timeout))

    @property
    def closing(self) -> bool:
        """Whether this connection closes after the answer being written."""
        return self._closing or self._server.stopping

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task


async def _quietly(sending: Awaitable[None]) -> None:
    with contextlib.suppress(ConnectionError):
        await sending


class Server:
    """Serves `handler` on one listening socket until `shutdown`."""

    def __init__(self, handler: Handler, *, max_body: Callable[[], int], errors: ErrorAnswers,
                 keepalive_timeout: float = KEEPALIVE_SECONDS,
                 read_timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.handler = handler
        self.errors = errors
        self.max_body = max_body
        self.keepalive_timeout = keepalive_timeout
        self.read_timeout = read_timeout
        self.connections: set[_Connection] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None
        self.loop = asyncio.get_running_loop()
        self._sweep: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, *, backlog: int = 100) -> None:
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, backlog=backlog)
        self._schedule_sweep()

    def _schedule_sweep(self) -> None:
        # One timer for every connection, not one per request: a connection idle (or a
        # request stalled) past its timeout is closed (refused) within a quarter more.
        period = min(self.keepalive_timeout, self.read_timeout) / 4
        self._sweep = self.loop.call_later(period, self._sweep_idle)

    def _sweep_idle(self) -> None:
        now = self.loop.time()
        idle, stalled = now - self.keepalive_timeout, now - self.read_timeout
        for conn in list(self.connections):
            conn.close_when_idle_since(idle)
            conn.refuse_if_stalled_since(stalled, self.read_timeout)
        self._schedule_sweep()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def drain(self) -> None:
        """Go on accepting and answering, but close each connection after its answer (with
        `Connection: close`), so that its client's next request connects anew, through a
        Service to another replica once this one is out of its endpoints."""
        self.stopping = True

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, close idle connections, give the requests being answered up to
        `grace` seconds, then cancel what is left and close every connection."""
        self.stopping = True
        self.stop_accepting()
        if self._sweep is not None:
            self._sweep.cancel()
        for conn in list(self.connections):
            conn.close_if_idle()
        busy = {c.task for c in self.connections if c.task is not None}
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
