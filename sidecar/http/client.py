"""The router's own HTTP/1.1 client: the one place it makes upstream HTTP calls.

Keep-alive connections per endpoint (`Client`), one write per request, httptools (llhttp,
C) to parse the answer, and its body handed over chunk by chunk as it arrives. Bodies pass
through unchanged (no decompression, no re-encoding); an answer's body can be piped
straight into a `Reply` (`sidecar.http.messages`), so server-sent events reach the client
as the model emits them.

aiohttp's ClientSession spent 140 to 170 us of CPU per request on loopback (a third to a
half of the router's), on request and response objects, a task for the body, cookie,
redirect and trace machinery the router never uses; this client spends 55 to 70 us.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools
import yarl

from sidecar.http.messages import Reply

# An idle pooled connection older than this is closed rather than reused, so a request
# rarely meets one the server is closing at the same moment (aiohttp's default).
KEEPALIVE_SECONDS = 15.0
# Past this much body read from the upstream and not yet written to the client, the
# upstream is paused until the client catches up.
_PAUSE_BYTES = 256 * 1024


# --- what can go wrong ------------------------------------------------------------------


# The most an answer's status line and headers may take; past it the answer is broken.
MAX_ANSWER_HEAD_BYTES = 64 * 1024


class UpstreamError(Exception):
    """A call to an upstream failed."""


class ConnectFailed(UpstreamError):
    def __init__(self, address: str, os_error: OSError) -> None:
        super().__init__(f"cannot connect to {address}: {os_error}")
        self.os_error = os_error


class OutOfFiles(UpstreamError):
    """The router itself could open no socket (EMFILE, ENFILE): nothing is wrong with the
    upstream, so it must not be reported as unreachable."""

    def __init__(self, address: str, os_error: OSError) -> None:
        super().__init__(f"connecting to {address}: the router is out of file descriptors "
                         f"({os_error.strerror})")
        self.os_error = os_error


class ConnectTimedOut(UpstreamError):
    pass


class ReadTimedOut(UpstreamError, TimeoutError):
    """No response bytes within the read timeout."""


class Disconnected(UpstreamError):
    """The connection closed, or carried something that is not an HTTP response."""


class Connection(asyncio.Protocol):
    """One keep-alive connection to an upstream; one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 deadlines: ReadDeadlines | None = None) -> None:
        self._loop = loop
        self._deadlines = deadlines or ReadDeadlines(loop)
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        # Called if the server closes this connection while it waits in the pool, whose
        # key (the base URL) is `pool_key`.
        self.on_idle_close: Callable[[Connection], None] | None = None
        self.pool_key = ""
        # Whether it served an exchange before the current one (it came from the pool).
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0  # set once the final (non-1xx) head is in
        self.length: int | None = None  # the answer's Content-Length, once its head is in
        self.reason = ""
        self.headers: list[tuple[bytes, bytes]] = []
        self.reusable = False
        self.heard = False  # any byte of an answer to the current request
        self._head_bytes = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._until_close = False
        self._paused = False
        # While piping (`pipe`): where each piece of body goes as it arrives.
        self._sink: Callable[[bytes], None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.heard = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._broken(f"not an HTTP response: {e}")
            return
        if not self.status:  # all of it was head: httptools keeps a header line until it ends
            self._head_bytes += len(data)
            if self._head_bytes > MAX_ANSWER_HEAD_BYTES:
                self._broken(f"an answer's status line and headers over {MAX_ANSWER_HEAD_BYTES}"
                             " bytes")

    def _broken(self, why: str) -> None:
        self._fail(Disconnected(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.reusable = False
        if self.on_idle_close is not None:
            self.on_idle_close(self)
            self.on_idle_close = None
        if self._done:
            return
        if self._until_close and self.status:
            self._done = True  # a body without length ends with its connection
            self._wake()
        else:
            self._fail(Disconnected(f"connection closed{f': {exc}' if exc else ''}"))

    # httptools callbacks

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self.headers = []  # an interim answer (100 Continue): the real one follows
            return
        self.status = status
        length = None
        framed = False
        for name, value in self.headers:
            if len(name) == 14 and name.lower() == b"content-length":
                length = int(value)  # llhttp has checked it
                framed = True
            elif len(name) == 17 and name.lower() == b"transfer-encoding":
                framed = True
        self.length = length
        self._until_close = not framed
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._sink(body)
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.status:
            return  # the end of an interim answer
        self._done = True
        self.reusable = self._parser.should_keep_alive()
        self._wake()

    # the exchange

    def send(self, data: list[bytes]) -> None:
        self._reset()
        assert self.transport is not None
        self.transport.writelines(data)

    async def head(self, read_timeout: float) -> None:
        """Until the response's status and headers are in."""
        while not self.status:
            if self._error is not None:
                raise self._error
            await self._wait(read_timeout)

    async def chunk(self, read_timeout: float) -> bytes:
        """The body read so far and not yet taken; b"" once it has all been taken."""
        while True:
            if self._chunks:
                return self._take()
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait(read_timeout)

    @property
    def complete(self) -> bool:
        """Whether the whole answer is in (what is left of its body: `take_whole`)."""
        return self._done

    def take_whole(self) -> bytes:
        """The body read and not yet taken, once the answer is `complete`."""
        assert self._done, "the answer is not complete"
        return self._take()

    def _take(self) -> bytes:
        """The body read and not yet taken; reading resumes if the buffer had paused it."""
        chunks = self._chunks
        taken = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return taken

    async def whole(self, read_timeout: float) -> bytes:
        """The rest of the body, once it has all arrived."""
        parts = []
        while chunk := await self.chunk(read_timeout):
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def pipe(self, reply: Reply, read_timeout: float,
                   on_first_chunk: Callable[[], None]) -> bool:
        """The rest of the body into `reply`, each piece written by this protocol's
        callback as it arrives: no task wakes per chunk, and one stall timer per stream
        instead of one per read (so a stall is noticed between one and two read timeouts
        after the last byte). Reading pauses while the client's socket is full, and that
        time does not count as a stall. True once the body has ended; False if the
        client left; Disconnected or ReadTimedOut if the upstream failed."""
        loop = self._loop
        first = True
        client_gone = False
        last = loop.time()

        def resume() -> None:
            nonlocal last
            last = loop.time()
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()

        def sink(data: bytes) -> None:
            nonlocal first, client_gone, last
            if client_gone:
                return
            if first:
                first = False
                on_first_chunk()
            last = loop.time()
            try:
                more = reply.write_nowait(data, resume)
            except ConnectionError:
                client_gone = True
                self._wake()
                return
            if not more and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()

        if self._chunks:  # what came before the pipe was laid
            buffered = b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            sink(buffered)
        if self._paused and not reply.waiting and self.transport is not None:
            self._paused = False  # paused for the buffer above, not by the client
            self.transport.resume_reading()
        if first and self._done:
            on_first_chunk()  # an empty body: its end is its first byte
        self._sink = sink
        try:
            while True:
                if client_gone:
                    return False
                if self._done:
                    return True
                if self._error is not None:
                    raise self._error
                waiter = self._waiter = loop.create_future()
                timer = loop.call_later(read_timeout, _stalled, waiter)
                try:
                    await waiter
                except _Stall:
                    idle = loop.time() - last
                    if not self._paused and idle >= read_timeout:
                        raise ReadTimedOut(f"no answer within {read_timeout:g} s") from None
                finally:
                    timer.cancel()
                    self._waiter = None
        finally:
            self._sink = None

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, read_timeout: float) -> None:
        waiter = self._waiter = self._loop.create_future()
        deadlines = self._deadlines
        deadlines.watch(waiter, read_timeout)
        try:
            await waiter
        finally:
            deadlines.forget(waiter)
            self._waiter = None


class _Stall(Exception):
    """The stall timer of a pipe fired: the pipe checks when it last read."""


def _stalled(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(_Stall())


# The shortest period `ReadDeadlines` checks at, however short a timeout.
_MIN_CHECK_PERIOD = 0.01


class ReadDeadlines:
    """The read timeouts of every connection of one client, kept by one timer.

    A timer per read cost about 2 us a request (uvloop makes and frees a libuv timer each
    time). Here a read that waits is a dictionary entry, and one timer checks the entries
    every quarter of the shortest timeout among them, and only while one waits: a read
    fails between 1 and 1.25 times its timeout after it began to wait.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # waiter -> (deadline, timeout)
        self._waiting: dict[asyncio.Future[None], tuple[float, float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._period = 0.0

    def watch(self, waiter: asyncio.Future[None], timeout: float) -> None:
        """Fail `waiter` with ReadTimedOut unless it is done or forgotten by `timeout`."""
        self._waiting[waiter] = (self._loop.time() + timeout, timeout)
        period = max(timeout / 4, _MIN_CHECK_PERIOD)
        if self._timer is None or period < self._period:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(period)

    def forget(self, waiter: asyncio.Future[None]) -> None:
        self._waiting.pop(waiter, None)  # gone already if it expired

    @property
    def armed(self) -> bool:
        """Whether the timer is set (it is only while a read waits)."""
        return self._timer is not None

    def _arm(self, period: float) -> None:
        self._period = period
        self._timer = self._loop.call_later(period, self._check)

    def _check(self) -> None:
        self._timer = None
        now = self._loop.time()
        expired = [(w, t) for w, (deadline, t) in self._waiting.items() if deadline <= now]
        for waiter, timeout in expired:
            del self._waiting[waiter]
            if not waiter.done():
                waiter.set_exception(ReadTimedOut(f"no answer within {timeout:g} s"))
        if self._waiting:
            shortest = min(t for _, t in self._waiting.values())
            self._arm(max(shortest / 4, _MIN_CHECK_PERIOD))


@dataclass(frozen=True)
class _Endpoint:
    """What a request needs to know of a base URL, parsed once."""

    base_url: str  # the pool's key (a str caches its hash; this dataclass would not)
    host: str
    port: int
    ssl: bool
    prefix: str  # the base URL's path without its trailing slash
    host_header: bytes


class Client:
    """Keep-alive connections per upstream endpoint, reused most recent first."""

    def __init__(self, connect_timeout: float, keepalive_seconds: float = KEEPALIVE_SECONDS):
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_seconds
        self._idle: dict[str, list[Connection]] = {}  # by base URL
        self._endpoints: dict[str, _Endpoint] = {}
        self._ssl: ssl.SSLContext | None = None
        self._deadlines: ReadDeadlines | None = None

    def endpoint(self, base_url: str) -> _Endpoint:
        known = self._endpoints.get(base_url)
        if known is None:
            known = self._endpoints[base_url] = _parse_endpoint(base_url)
            if len(self._endpoints) > 4096:  # pod addresses come and go
                self._endpoints = {base_url: known}
        return known

    def pooled(self, endpoint: _Endpoint) -> Connection | None:
        """The most recently used idle connection to `endpoint` still fit to reuse (its
        `reused` set), if there is one."""
        idle = self._idle.get(endpoint.base_url)
        if idle is None:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            conn.on_idle_close = None
            if conn.transport is not None and now - conn.idle_since < self._keepalive:
                conn.reused = True
                if not idle:
                    del self._idle[endpoint.base_url]
                return conn
            conn.close()
        del self._idle[endpoint.base_url]
        return None

    async def connect(self, endpoint: _Endpoint) -> Connection:
        """A new connection to `endpoint`."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        if deadlines is None:  # made on the loop the connections live on
            deadlines = self._deadlines = ReadDeadlines(loop)
        address = f"{endpoint.host}:{endpoint.port}"
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop, deadlines),
                    endpoint.host,
                    endpoint.port,
                    ssl=self._ssl_context() if endpoint.ssl else None,
                )
        except TimeoutError as e:
            raise ConnectTimedOut(f"connecting to {address} timed out") from e
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise OutOfFiles(address, e) from e
            raise ConnectFailed(address, e) from e
        return conn

    def done(self, endpoint: _Endpoint, conn: Connection) -> None:
        """Give `conn` back after a whole exchange, or close it if it cannot serve another."""
        if conn.reusable and conn.transport is not None:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.setdefault(endpoint.base_url, []).append(conn)
            conn.pool_key = endpoint.base_url
            conn.on_idle_close = self._forget
        else:
            conn.close()

    def _forget(self, conn: Connection) -> None:
        base_url = conn.pool_key
        idle = self._idle.get(base_url)
        if idle is not None and conn in idle:
            idle.remove(conn)
            if not idle:
                del self._idle[base_url]

    def idle(self) -> int:
        """How many pooled connections wait for a request."""
        return sum(len(idle) for idle in self._idle.values())

    def close(self) -> None:
        for idle in list(self._idle.values()):
            for conn in idle:
                conn.on_idle_close = None
                conn.close()
        self._idle.clear()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl


def _parse_endpoint(base_url: str) -> _Endpoint:
    url = yarl.URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    host = url.raw_host or url.host  # punycode for a name, as it goes on the wire
    authority = f"[{host}]" if ":" in host else host
    if url.explicit_port is not None:
        authority += f":{url.explicit_port}"
    return _Endpoint(
        base_url=base_url,
        host=host,
        port=url.port or (443 if url.scheme == "https" else 80),
        ssl=url.scheme == "https",
        prefix=url.raw_path.rstrip("/"),
        host_header=authority.encode("ascii"),
    )
