"""`sidecar.http.client.Connection.pipe`: an upstream answer's body written to the client from
the protocol's callback, with the upstream paused while the client's socket is full, a
stall cut after the read timeout, and a client that leaves ending the pipe. The upstream's
bytes are fed to the protocol by hand; the client is a stand-in for `Reply`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sidecar.http import client as upstream


class FakeTransport:
    def __init__(self) -> None:
        self.reading = True
        self.closed = False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def writelines(self, data: list[bytes]) -> None:
        pass


class FakeReply:
    """Takes writes until `full`; then says so and keeps the callback to call on drain."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.full = False
        self.gone = False
        self.on_writable: Callable[[], None] | None = None

    @property
    def waiting(self) -> bool:
        return self.full

    def write_nowait(self, data: bytes, on_writable: Callable[[], None]) -> bool:
        if self.gone:
            raise ConnectionResetError("gone")
        self.received.append(data)
        if self.full:
            self.on_writable = on_writable
            return False
        return True

    def drain(self) -> None:
        self.full = False
        callback, self.on_writable = self.on_writable, None
        assert callback is not None
        callback()


HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def connection() -> tuple[upstream.Connection, FakeTransport]:
    conn = upstream.Connection(asyncio.get_running_loop())
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.send([b"GET / HTTP/1.1\r\n\r\n"])
    conn.data_received(HEAD)
    await conn.head(1.0)
    return conn, transport


async def piped(read_timeout: float = 5.0, on_first_chunk: Callable[[], None] = lambda: None
                ) -> tuple[upstream.Connection, FakeTransport, FakeReply, asyncio.Future[bool]]:
    """A connection whose answer's head is in, piping into a fresh client from now on."""
    conn, transport = await connection()
    reply = FakeReply()
    piping = asyncio.ensure_future(conn.pipe(reply, read_timeout, on_first_chunk))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the pipe's task lays its sink
    return conn, transport, reply, piping


async def test_chunks_go_to_the_client_as_they_arrive_and_the_end_ends_the_pipe() -> None:
    conn, _ = await connection()
    conn.data_received(chunk(b"early"))  # before the pipe is laid: buffered, then written
    reply = FakeReply()
    firsts: list[None] = []
    piping = asyncio.ensure_future(conn.pipe(reply, 5.0, lambda: firsts.append(None)))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert reply.received == [b"early"]
    conn.data_received(chunk(b"one"))
    conn.data_received(chunk(b"two"))
    assert reply.received == [b"early", b"one", b"two"]  # written from the callback itself
    conn.data_received(b"0\r\n\r\n")
    assert await piping is True
    assert len(firsts) == 1


async def test_the_upstream_pauses_while_the_client_is_full_and_resumes_on_drain() -> None:
    conn, transport, reply, piping = await piped()
    reply.full = True
    conn.data_received(chunk(b"x" * 100))
    assert not transport.reading
    reply.drain()
    assert transport.reading
    conn.data_received(chunk(b"y") + b"0\r\n\r\n")
    assert await piping is True
    assert reply.received == [b"x" * 100, b"y"]


async def test_a_stall_past_the_read_timeout_is_read_timed_out() -> None:
    conn, _ = await connection()
    reply = FakeReply()
    with pytest.raises(upstream.ReadTimedOut):
        await conn.pipe(reply, 0.05, lambda: None)  # type: ignore[arg-type]


async def test_a_client_full_for_longer_than_the_read_timeout_is_no_stall() -> None:
    conn, _, reply, piping = await piped(read_timeout=0.05)
    reply.full = True
    conn.data_received(chunk(b"x"))
    await asyncio.sleep(0.2)  # four read timeouts with the client full
    assert not piping.done()
    reply.drain()
    conn.data_received(b"0\r\n\r\n")
    assert await piping is True


async def test_a_client_that_leaves_ends_the_pipe() -> None:
    conn, _, reply, piping = await piped()
    reply.gone = True
    conn.data_received(chunk(b"x"))
    assert await piping is False


async def test_the_upstream_closing_mid_body_is_disconnected() -> None:
    conn, _, _, piping = await piped()
    conn.data_received(chunk(b"x"))
    conn.connection_lost(None)
    with pytest.raises(upstream.Disconnected):
        await piping
