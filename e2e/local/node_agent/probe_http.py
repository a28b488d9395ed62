"""The probe requests: the one place of the agent that calls the programs it runs."""

from __future__ import annotations

import asyncio

import aiohttp

from e2e.local.node_agent.probes import ProbeSpec


async def probe_once(session: aiohttp.ClientSession, spec: ProbeSpec) -> bool:
    """One probe attempt: HTTP 200-399 or an accepted TCP connection succeed; anything
    else, a timeout included, fails. exec and grpc probes cannot run here and fail."""
    try:
        async with asyncio.timeout(spec.timeout):
            if spec.kind == "httpGet":
                url = f"{spec.scheme.lower()}://{spec.host}:{spec.port}{spec.path}"
                async with session.get(
                    url, headers=dict(spec.headers), allow_redirects=False, ssl=False
                ) as response:
                    return 200 <= response.status < 400
            if spec.kind == "tcpSocket":
                _reader, writer = await asyncio.open_connection(spec.host, spec.port)
                writer.close()
                await writer.wait_closed()
                return True
    except (TimeoutError, OSError, aiohttp.ClientError):
        return False
    return False
