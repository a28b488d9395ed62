"""kubecore.handshake: a request cancelled during its TLS handshake closes its socket.

The server is a plain TCP listener that reads the client's first bytes (its ClientHello,
so the handshake is under way) and never answers; the request is then cancelled, as a
program's requests in flight are when it stops. The server sees the connection closed, or
it stays open until the garbage collector finds it (which the integration tier reports as
a ResourceWarning on whichever test it happens in).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import httpx

from kubecore import handshake


async def cancelled_during_the_handshake() -> bool:
    """Whether the client closed the connection of a request cancelled mid-handshake."""
    hello, closed = asyncio.Event(), asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        hello.set()
        await reader.read()  # until the client closes
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(verify=ssl.create_default_context()) as client:
            request = asyncio.create_task(client.get(f"https://127.0.0.1:{port}/"))
            await hello.wait()
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
            try:
                await asyncio.wait_for(closed.wait(), 5.0)
            except TimeoutError:
                return False
            return True
    finally:
        server.close()


async def test_a_request_cancelled_during_its_handshake_closes_its_socket() -> None:
    handshake.install()
    assert await cancelled_during_the_handshake()


def test_install_wraps_once() -> None:
    from httpcore._backends.anyio import AnyIOStream

    handshake.install()
    first = AnyIOStream.start_tls
    handshake.install()
    assert AnyIOStream.start_tls is first
