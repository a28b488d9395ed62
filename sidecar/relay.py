"""The relay of one request to a member: its bytes out through the HTTP client, the
member's answer back into the client's reply.

An answer of known length up to `WHOLE_REPLY_BYTES` is read whole and sent in one write;
anything else (server-sent events, chunked, large) gets its head at once and then each
chunk as it arrives. A failure before the answer starts propagates for the caller to
answer; after it has started it ends the relay, and the client's connection is closed so
that a truncated body is not taken for a whole one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.http.client import Client, Connection, Disconnected, ReadTimedOut
from sidecar.http.headers import response_headers
from sidecar.http.messages import Reply, Request

logger = logging.getLogger(__name__)


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
    error_event: Callable[[int, bytes], bytes],
    answered_by: str | None = None,
) -> Relay:
    """Send `body` to `base_url` + the request's path and stream the answer back in
    `reply`.

    Errors before the answer starts are `UpstreamError`s and propagate (the caller
    translates them into an error answer); after it has started they end the relay. A
    body of known length up to `WHOLE_REPLY_BYTES` goes out with its head once it is all
    in, so a break before then is still an error before the answer.
    A `reply` already started (a held stream, `sidecar.held_stream`) is continued by the
    upstream's events, and an upstream error status becomes its last event, as
    `error_event(status, body)` frames it.
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
            relay = await _relay_into(request, reply, conn, read_timeout, on_first_chunk,
                                      error_event)
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
    conn: Connection, read_timeout: float, on_first_chunk: Callable[[], None]
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
    conn: Connection,
    read_timeout: float,
    on_first_chunk: Callable[[], None],
    error_event: Callable[[int, bytes], bytes],
) -> Relay:
    """The upstream's answer into a stream the client already has: its events as they
    come, or its error status as the stream's last event."""
    if conn.status == 200:
        return await _relay_chunks(request, reply, conn, read_timeout, on_first_chunk)
    whole = await _whole_body(conn, read_timeout, on_first_chunk)
    try:
        await reply.end(error_event(conn.status, whole))
    except ConnectionError:
        return Relay(reply.status, client_gone=True, answered=conn.status)
    return Relay(reply.status, answered=conn.status)


async def _relay_chunks(
    request: Request,
    reply: Reply,
    conn: Connection,
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


def _broken(request: Request, reply: Reply, exc: Disconnected | ReadTimedOut) -> Relay:
    logger.warning("upstream failed mid-response for %s: %s", request.path, exc)
    reply.abort()
    kind = "timeout" if isinstance(exc, ReadTimedOut) else "disconnect"
    return Relay(reply.status, upstream_failure=kind)
