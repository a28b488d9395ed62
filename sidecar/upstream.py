"""The one place the router makes upstream HTTP calls.

One `ClientSession` per application, created and closed in `cleanup_ctx`. Bodies pass
through unchanged (no decompression, no re-encoding) and responses stream chunk by chunk
into a `StreamResponse`, so server-sent events reach the client as the model emits them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import yarl
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

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

    async def acquire(self, endpoint: str) -> None:
        """Take a slot of `endpoint`; give it back with `release` (try/finally)."""
        busy = self._busy.get(endpoint, 0)
        if busy < self._limit and endpoint not in self._waiters:
            self._busy[endpoint] = busy + 1
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


SESSION = web.AppKey("upstream_session", aiohttp.ClientSession)
SLOTS = web.AppKey("upstream_slots", EndpointSlots)

# RFC 9110 section 7.6.1 connection-specific fields, plus the proxy ones.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Set by the client library from the body it sends; never copied from the client.
_REQUEST_OWN = frozenset({"host", "content-length"})
_REQUEST_SKIP = HOP_BY_HOP | _REQUEST_OWN


@dataclass
class Relay:
    """How a forwarded response ended once it had started."""

    response: web.StreamResponse
    # Set when the upstream broke mid-response (kind for metrics); the client's
    # connection has then been closed so it cannot mistake a truncated body for a whole one.
    upstream_failure: str | None = None
    client_gone: bool = False


def session_context(
    connect_timeout: float,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        session = aiohttp.ClientSession(
            # Concurrency is bounded per endpoint by EndpointSlots, before this point.
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            # The default 300 s total would cut long generations; reads are bounded per call.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
            # Pass bytes as they are: the client negotiated the encoding, not us.
            auto_decompress=False,
            # Headers the library would invent; the client's own are forwarded instead.
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app[SESSION] = session
        app[SLOTS] = EndpointSlots(MAX_IN_FLIGHT_PER_ENDPOINT)
        yield
        await session.close()

    return ctx


def _without(
    headers: CIMultiDictProxy[str], names: frozenset[str], more: frozenset[str]
) -> CIMultiDict[str]:
    """A copy of `headers` without `names`, `more`, and whatever `Connection` lists."""
    # Copy, then pop: both run in multidict's C code, cheaper than filtering in Python.
    out = CIMultiDict(headers)
    listed = out.get("Connection")
    for name in names:
        out.popall(name, None)
    for name in more:
        out.popall(name, None)
    if listed:
        for token in listed.split(","):
            out.popall(token.strip(), None)
    return out


_NOTHING: frozenset[str] = frozenset()


def request_headers(
    headers: CIMultiDictProxy[str], *, drop: frozenset[str] = _NOTHING
) -> CIMultiDict[str]:
    """The client's headers minus hop-by-hop ones and any in `drop`."""
    return _without(headers, _REQUEST_SKIP, drop)


def response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return _without(headers, HOP_BY_HOP, _NOTHING)


async def forward(
    request: web.Request,
    session: aiohttp.ClientSession,
    *,
    url: str,
    body: bytes,
    headers: CIMultiDict[str],
    connect_timeout: float,
    read_timeout: float,
    on_first_chunk: Callable[[], None],
) -> Relay:
    """Send `body` to `url` and stream the answer back to the client of `request`.

    Errors before the response starts are aiohttp's own and propagate (the caller
    translates them into an error answer); after it has started they end the relay.
    """
    async with session.request(
        request.method,
        url,
        data=body,
        headers=headers,
        timeout=_timeout(connect_timeout, read_timeout),
        allow_redirects=False,
    ) as upstream:
        # A body of known length is one whole answer: its headers go out with its first
        # bytes. Anything else (SSE, chunked) gets its headers at once.
        length = upstream.content_length
        kind = web.StreamResponse if length is None else _WholeResponse
        response = kind(
            status=upstream.status,
            reason=upstream.reason,
            headers=response_headers(upstream.headers),
        )
        try:
            await response.prepare(request)
        except ConnectionError:
            return Relay(response, client_gone=True)
        if length is not None and length <= WHOLE_REPLY_BYTES:
            return await _relay_whole(request, upstream, response, on_first_chunk)
        return await _relay_chunks(request, upstream, response, on_first_chunk)


# A reply of known length up to this size is read in one call and written in one: a
# typical JSON answer arrives in one segment, so this is what streaming it would send,
# for fewer turns of the loop. Anything longer, or of unknown length, streams.
WHOLE_REPLY_BYTES = 64 * 1024


@functools.lru_cache(maxsize=16)
def _timeout(connect_timeout: float, read_timeout: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)


async def _relay_whole(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    on_first_chunk: Callable[[], None],
) -> Relay:
    try:
        whole = await upstream.read()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
        return _broken(request, response, "disconnect", e)
    except TimeoutError as e:
        return _broken(request, response, "timeout", e)
    on_first_chunk()
    try:
        await response.write_eof(whole)
    except ConnectionError:
        return Relay(response, client_gone=True)
    return Relay(response)


async def _relay_chunks(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    on_first_chunk: Callable[[], None],
) -> Relay:
    """Each chunk to the client as soon as it is read."""
    first = True
    while True:
        try:
            chunk, end_of_chunk = await upstream.content.readchunk()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            return _broken(request, response, "disconnect", e)
        except TimeoutError as e:
            return _broken(request, response, "timeout", e)
        if not chunk and end_of_chunk:
            continue  # an HTTP chunk boundary with no new data
        if first:
            on_first_chunk()
            first = False
        if not chunk:
            break  # end of body
        try:
            await response.write(chunk)
        except ConnectionError:
            # The client went away; leaving the block closes the upstream call too.
            return Relay(response, client_gone=True)
    try:
        await response.write_eof()
    except ConnectionError:
        return Relay(response, client_gone=True)
    return Relay(response)


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


class _WholeResponse(web.StreamResponse):
    """Streams like its parent, but sends its headers with the first chunk of the body:
    one segment instead of two for a typical JSON answer, which halves the client's reads.
    (`_send_headers_immediately` is aiohttp's own switch, false for `web.Response`.)"""

    _send_headers_immediately = False


def _broken(
    request: web.Request, response: web.StreamResponse, kind: str, exc: BaseException
) -> Relay:
    logger.warning("upstream failed mid-response for %s: %s", request.path, exc)
    if request.transport is not None:
        request.transport.close()
    return Relay(response, upstream_failure=kind)
