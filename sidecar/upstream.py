"""The one place the router makes upstream HTTP calls.

One `Client` (keep-alive HTTP/1.1 connections per endpoint) per API (`sidecar.app.Api`).
Bodies pass through unchanged (no decompression, no re-encoding) and answers stream chunk
by chunk into the client's `Reply` (`sidecar.http_server`), so server-sent events reach
the client as the model emits them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import json
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools
import yarl

from sidecar import held_stream
from sidecar.http_server import Reply, Request

logger = logging.getLogger(__name__)

# Far above any model server's parallel slots, low enough that thousands of held
# requests released at once by a swap wait for a turn instead of exhausting descriptors.
MAX_IN_FLIGHT_PER_ENDPOINT = 1024


class EndpointSlots:
    """At most `limit` requests in flight to each upstream endpoint; the rest wait here.

    Waiting here costs microseconds, whereas a request parked in aiohttp's connector pool
    has already paid for building itself: when a swap releases thousands of held requests
    in one loop iteration, only `limit` of them do that work (and start connect timers)
    at once, so the timers are not starved by the others.

    Paid on every proxied request, so the free path is a counter and no object: waiters
    (first come, first served) exist only while an endpoint is at its limit, and an
    endpoint is forgotten once unused, as pod addresses come and go.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._busy: dict[str, int] = {}
        self._waiters: dict[str, collections.deque[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """How many endpoints have a request in flight or waiting."""
        return len(self._busy)

    def take(self, endpoint: str) -> bool:
        """Take a free slot of `endpoint` at once, if there is one (no one waits for it)."""
        busy = self._busy.get(endpoint, 0)
        if busy < self._limit and endpoint not in self._waiters:
            self._busy[endpoint] = busy + 1
            return True
        return False

    async def acquire(self, endpoint: str) -> None:
        """Take a slot of `endpoint`; give it back with `release` (try/finally)."""
        if self.take(endpoint):
            return
        waiters = self._waiters.setdefault(endpoint, collections.deque())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(endpoint)  # handed a slot just as it was cancelled
            else:
                with contextlib.suppress(ValueError):  # already skipped by `release`
                    waiters.remove(future)
                self._tidy(endpoint)
            raise

    def release(self, endpoint: str) -> None:
        waiters = self._waiters.get(endpoint)
        while waiters:
            future = waiters.popleft()
            if not future.done():  # a cancelled waiter is skipped
                # The slot passes to the next waiter: the count stays as it is.
                future.set_result(None)
                self._tidy(endpoint)
                return
        self._busy[endpoint] -= 1
        self._tidy(endpoint)

    def _tidy(self, endpoint: str) -> None:
        waiters = self._waiters.get(endpoint)
        if waiters is not None and not waiters:
            del self._waiters[endpoint]
            waiters = None
        if waiters is None and self._busy.get(endpoint) == 0:
            del self._busy[endpoint]


# RFC 9110 section 7.6.1 connection-specific fields, plus the proxy ones. Header names
# are compared as bytes, lower-cased, as they come off the wire.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Written by the client from the body it sends; never copied from the client.
_REQUEST_OWN = frozenset({b"host", b"content-length", b"expect"})
_REQUEST_SKIP = HOP_BY_HOP | _REQUEST_OWN
# Written by the router's server for the client.
_RESPONSE_SKIP = HOP_BY_HOP | {b"content-length", b"date"}

# An idle pooled connection older than this is closed rather than reused, so a request
# rarely meets one the server is closing at the same moment (aiohttp's default).
KEEPALIVE_SECONDS = 15.0
# Past this much body read from the upstream and not yet written to the client, the
# upstream is paused until the client catches up.
_PAUSE_BYTES = 256 * 1024


# --- what can go wrong (sidecar.errors translates these) ----------------------------------


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


@dataclass
class Relay:
    """How a forwarded response ended once it had started."""

    status: int  # what the client was answered (0: nothing)
    # Set when the upstream broke mid-response (kind for metrics); the client's
    # connection has then been closed so it cannot mistake a truncated body for a whole one.
    upstream_failure: str | None = None
    client_gone: bool = False
    # The upstream's status when the client's response had already started with another
    # (a held stream, answered 200 early): what the metrics count.
    answered: int | None = None


# --- the HTTP/1.1 client ------------------------------------------------------------------
#
# aiohttp's ClientSession spent 140 to 170 us of CPU per request on loopback (a third to a
# half of the router's), on request and response objects, a task for the body, cookie,
# redirect and trace machinery the router never uses; this client spends 55 to 70 us.
# What the router needs is small: keep-alive connections per endpoint, one write per
# request, httptools (llhttp, C) to parse the answer, and its body handed over chunk by
# chunk as it arrives.


class _Connection(asyncio.Protocol):
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
        self.on_idle_close: Callable[[_Connection], None] | None = None
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
        self._idle: dict[str, list[_Connection]] = {}  # by base URL
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

    def pooled(self, endpoint: _Endpoint) -> _Connection | None:
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

    async def connect(self, endpoint: _Endpoint) -> _Connection:
        """A new connection to `endpoint`."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        if deadlines is None:  # made on the loop the connections live on
            deadlines = self._deadlines = ReadDeadlines(loop)
        address = f"{endpoint.host}:{endpoint.port}"
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, deadlines),
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

    def done(self, endpoint: _Endpoint, conn: _Connection) -> None:
        """Give `conn` back after a whole exchange, or close it if it cannot serve another."""
        if conn.reusable and conn.transport is not None:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.setdefault(endpoint.base_url, []).append(conn)
            conn.pool_key = endpoint.base_url
            conn.on_idle_close = self._forget
        else:
            conn.close()

    def _forget(self, conn: _Connection) -> None:
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


# --- headers ------------------------------------------------------------------------------


_NOTHING: frozenset[bytes] = frozenset()
RawHeaders = list[tuple[bytes, bytes]]


def request_headers(raw: RawHeaders, *, drop: frozenset[bytes] = _NOTHING) -> bytes:
    """The client's header lines minus hop-by-hop ones, whatever `Connection` lists and
    any in `drop` (lower-case names), ready to send."""
    if not drop:
        return _lines(raw, *_REQUEST_SKIPPING)
    skipping = _with_dropped.get(drop)
    if skipping is None:  # callers pass one of a few constant sets
        skipping = _with_dropped[drop] = _skipping(_REQUEST_SKIP | drop)
    return _lines(raw, *skipping)


def response_headers(raw: RawHeaders) -> bytes:
    """The upstream's header lines minus hop-by-hop ones, whatever `Connection` lists, and
    the framing the router writes itself (`Content-Length`, `Date`), ready to send."""
    return _lines(raw, *_RESPONSE_SKIPPING)


_Skipping = tuple[frozenset[bytes], frozenset[int]]


def _skipping(names: frozenset[bytes]) -> _Skipping:
    """A set of names to skip, with the lengths of its names."""
    return names, frozenset(len(name) for name in names)


_RESPONSE_SKIPPING = _skipping(_RESPONSE_SKIP)
_REQUEST_SKIPPING = _skipping(_REQUEST_SKIP)
# The request's names to skip with each set of further names dropped (`request_headers`).
_with_dropped: dict[frozenset[bytes], _Skipping] = {}


def _lines(raw: RawHeaders, skip: frozenset[bytes], sizes: frozenset[int]) -> bytes:
    kept = []
    listed: frozenset[bytes] | None = None  # named by `Connection`, beyond hop-by-hop
    for name, value in raw:
        if len(name) not in sizes:  # no name to skip is this long: no need to lower it
            kept.append(b"%s: %s\r\n" % (name, value))
            continue
        low = name.lower()
        if low in skip:
            if low == b"connection":
                tokens = _connection_tokens(value)
                if tokens:
                    listed = tokens if listed is None else listed | tokens
        else:
            kept.append(b"%s: %s\r\n" % (name, value))
    if listed is None:
        return b"".join(kept)
    return b"".join([b"%s: %s\r\n" % (name, value) for name, value in raw
                     if (low := name.lower()) not in skip and low not in listed])


_TOKENS: dict[bytes, frozenset[bytes]] = {}


def _connection_tokens(value: bytes) -> frozenset[bytes]:
    """The header names a `Connection` value lists, beyond the hop-by-hop ones."""
    tokens = _TOKENS.get(value)
    if tokens is None:
        tokens = frozenset(t.strip().lower() for t in value.split(b",") if t.strip())
        tokens -= HOP_BY_HOP
        if len(_TOKENS) < 256:  # the same few values ("keep-alive", "close") recur
            _TOKENS[value] = tokens
    return tokens


# --- the relay ----------------------------------------------------------------------------


async def forward(
    request: Request,
    reply: Reply,
    client: Client,
    *,
    base_url: str,
    body: bytes,
    headers: bytes,
    read_timeout: float,
    on_first_chunk: Callable[[], None],
    answered_by: str | None = None,
) -> Relay:
    """Send `body` to `base_url` + the request's path and stream the answer back in
    `reply`.

    Errors before the answer starts are `UpstreamError`s and propagate (the caller
    translates them into an error answer); after it has started they end the relay. A
    body of known length up to `WHOLE_REPLY_BYTES` goes out with its head once it is all
    in, so a break before then is still an error before the answer.
    A `reply` already started (a held stream, `held_stream`) is continued by the
    upstream's events, and an upstream error status becomes its last event.
    """
    endpoint = client.endpoint(base_url)
    head = b"%s %s%s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (
        request.method.encode("ascii"),
        endpoint.prefix.encode("ascii"),
        _target(request),
        endpoint.host_header,
        headers,
        len(body),
    )
    request_bytes = [head, body] if len(body) > 16 * 1024 else [head + body]
    # Not one coroutine for both: a pooled connection, the usual case, is taken at once.
    conn = client.pooled(endpoint) or await client.connect(endpoint)
    finished = False
    try:
        conn.send(request_bytes)
        # Starts now, with the member resident: a hold never eats into it.
        try:
            await conn.head(read_timeout)
        except Disconnected:
            if not conn.reused or conn.heard:
                raise
            # The keep-alive race: a server closes an idle connection when its own
            # keep-alive timeout ends (llama-server's is 5 s), and a request that went
            # out on it at that moment is never read. Closed with no byte of an answer,
            # a pooled connection is taken for that: the request goes once more on a new
            # connection, and a new one that fails the same way is a real failure.
            logger.debug("pooled connection to %s closed unanswered; sending again",
                         base_url)
            conn.close()
            conn = await client.connect(endpoint)
            conn.send(request_bytes)
            await conn.head(read_timeout)
        if reply.started:
            relay = await _relay_into(request, reply, conn, read_timeout, on_first_chunk)
            finished = relay.upstream_failure is None and not relay.client_gone
            return relay
        length = conn.length
        out_headers = response_headers(conn.headers)
        if answered_by is not None:  # sidecar.fallback.ANSWERED_BY
            out_headers += b"X-Modelpool-Backend: %s\r\n" % answered_by.encode()
        if length is not None and length <= WHOLE_REPLY_BYTES:
            # A body of known length is one whole answer: its head goes out with it.
            whole = await _whole_body(conn, read_timeout, on_first_chunk)
            try:
                await reply.send(conn.status, body=whole, reason=conn.reason or None,
                                 lines=out_headers)
            except ConnectionError:
                return Relay(conn.status, client_gone=True)
            finished = True
            return Relay(conn.status)
        # Anything else (SSE, chunked, large) gets its head at once, then each chunk.
        try:
            await reply.start(conn.status, reason=conn.reason or None, length=length,
                              lines=out_headers)
        except ConnectionError:
            return Relay(conn.status, client_gone=True)
        relay = await _relay_chunks(request, reply, conn, read_timeout, on_first_chunk)
        finished = relay.upstream_failure is None and not relay.client_gone
        return relay
    finally:
        if finished:
            client.done(endpoint, conn)
        else:
            conn.close()  # an answer may still be on its way: this connection is spent


def _target(request: Request) -> bytes:
    """The request's path and query as the client sent them (an absolute-form target, as
    a client configured for a proxy sends, loses its scheme and host)."""
    raw = request.target
    if not raw.startswith("/"):
        query = raw.find("?")
        raw = request.path + (raw[query:] if query >= 0 else "")
    return raw.encode("utf-8", "surrogateescape")


# A reply of known length up to this size is read in one call and written in one: a
# typical JSON answer arrives in one segment, so this is what streaming it would send,
# for fewer turns of the loop. Anything longer, or of unknown length, streams.
WHOLE_REPLY_BYTES = 64 * 1024


async def _whole_body(
    conn: _Connection, read_timeout: float, on_first_chunk: Callable[[], None]
) -> bytes:
    """The whole body (its first byte counted). Nothing of it has gone to the client, so
    a break before it is all in is an error like one before the head: the client is
    answered 502 or 504 rather than left with a closed connection."""
    try:
        whole = conn.take_whole() if conn.complete else await conn.whole(read_timeout)
    except Disconnected as e:
        raise Disconnected(f"the {conn.status} answer broke off before its body was whole: "
                           f"{e}") from e
    except ReadTimedOut as e:
        raise ReadTimedOut(f"the {conn.status} answer stalled before its body was whole: "
                           f"{e}") from e
    on_first_chunk()
    return whole


async def _relay_into(
    request: Request,
    reply: Reply,
    conn: _Connection,
    read_timeout: float,
    on_first_chunk: Callable[[], None],
) -> Relay:
    """The upstream's answer into a stream the client already has: its events as they
    come, or its error status as one OpenAI-shaped error event."""
    if conn.status == 200:
        return await _relay_chunks(request, reply, conn, read_timeout, on_first_chunk)
    whole = await _whole_body(conn, read_timeout, on_first_chunk)
    try:
        body = json.loads(whole)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
        body = None
    if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
        text = whole[:200].decode("utf-8", "replace")
        body = {"error": {"message": f"The backend answered {conn.status}: {text}",
                          "type": "upstream_error", "param": None, "code": "upstream_status"}}
    try:
        await reply.end(held_stream.sse_event(body))
    except ConnectionError:
        return Relay(reply.status, client_gone=True, answered=conn.status)
    return Relay(reply.status, answered=conn.status)


async def _relay_chunks(
    request: Request,
    reply: Reply,
    conn: _Connection,
    read_timeout: float,
    on_first_chunk: Callable[[], None],
) -> Relay:
    """Each chunk to the client as soon as it is read."""
    try:
        ended = await conn.pipe(reply, read_timeout, on_first_chunk)
    except (Disconnected, ReadTimedOut) as e:
        return _broken(request, reply, e)
    if not ended:
        return Relay(reply.status, client_gone=True)
    try:
        await reply.end()
    except ConnectionError:
        return Relay(reply.status, client_gone=True)
    return Relay(reply.status)


async def reachable(base_url: str, connect_timeout: float) -> bool:
    """Whether a fresh TCP connection to `base_url`'s host and port succeeds.

    Tells a dead endpoint from a keep-alive race: a pooled connection that the server
    closed fails the same way as a server that died, but only the dead one refuses a new
    connection."""
    parsed = yarl.URL(base_url)
    host, port = parsed.host, parsed.port
    if host is None or port is None:
        return False
    try:
        async with asyncio.timeout(connect_timeout):
            _reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def probe_ready(host: str, port: int, path: str, probe_timeout: float) -> bool:
    """Whether `GET path` on `host:port` answers 200 within `probe_timeout` seconds.

    The activator's early readiness probe of a swap's target (`sidecar.activation`): a
    fresh connection each time, closed once the status line is read; a refusal, a
    timeout or any other status is False."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    writer: asyncio.StreamWriter | None = None
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
        async with asyncio.timeout(probe_timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request.encode("ascii"))
            status_line = await reader.readline()
    except (OSError, TimeoutError, ValueError):
        return False
    finally:
        if writer is not None:
            writer.close()
    parts = status_line.split(None, 2)
    return len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1] == b"200"


def _broken(request: Request, reply: Reply, exc: Disconnected | ReadTimedOut) -> Relay:
    logger.warning("upstream failed mid-response for %s: %s", request.path, exc)
    reply.abort()
    kind = "timeout" if isinstance(exc, ReadTimedOut) else "disconnect"
    return Relay(reply.status, upstream_failure=kind)
