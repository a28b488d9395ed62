"""The floor under the router's CPU per request: the same parts with nothing else.

A proxy that parses each request with httptools, reads `model` with one `json.loads`,
sends the body to one upstream through the router's own client
(`sidecar.http.client.Client`) and writes the answer back in one write. No routing, no
activation, no metrics, no header filtering, no error handling. `bench_peers.py --bare`
runs it beside the router, so the difference between the two is what the router's own
logic costs.

    .venv/bin/python benchmarks/bare_proxy.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httptools
import uvloop

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sidecar.http.client import Client  # noqa: E402

_SKIP = frozenset({b"host", b"content-length", b"connection"})


class BareConnection(asyncio.Protocol):
    def __init__(self, client: Client, base_url: str) -> None:
        self._client = client
        self._base_url = base_url
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body, self._body = b"".join(self._body), []
        headers, self._headers = self._headers, []
        asyncio.get_running_loop().create_task(self._answer(self._url, headers, body))

    async def _answer(self, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        json.loads(body)["model"]  # what routing needs
        endpoint = self._client.endpoint(self._base_url)
        lines = b"".join(b"%s: %s\r\n" % (n, v) for n, v in headers if n.lower() not in _SKIP)
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (
            url, endpoint.host_header, lines, len(body))
        conn = self._client.pooled(endpoint) or await self._client.connect(endpoint)
        conn.send([head + body])
        await conn.head(30.0)
        whole = await conn.whole(30.0)
        self._client.done(endpoint, conn)
        answer = b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        assert self._transport is not None
        self._transport.write(answer % (conn.status, len(whole)) + whole)


async def serve(port: int, base_url: str) -> None:
    client = Client(5.0)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: BareConnection(client, base_url), "127.0.0.1", port,
                             backlog=2048)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2]))
