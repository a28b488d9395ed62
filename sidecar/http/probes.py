"""One-shot checks of an upstream on a fresh connection: does it accept one, does it answer
a readiness GET with 200."""

from __future__ import annotations

import asyncio
import contextlib

import yarl


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
