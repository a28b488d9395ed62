"""One HTTP server that answers for every pod of the scale testbed (`e2e.kwok.testbed`).

Bound to 0.0.0.0 on the members' port, it receives whatever is sent to any address of the
loopback pod network, and answers as an idle llama-server would: `/slots` lists one slot
that is not processing, `/health` and `/v1/models` answer 200. It counts the requests each
pod address received (the address the connection reached, `getsockname`), which is how a
benchmark sees how often the reconciler probes each pod.
"""

from __future__ import annotations

import collections
import json
import socket

from aiohttp import web


class StandIn:
    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self._runner: web.AppRunner | None = None
        self.port = 0

    def _address(self, request: web.Request) -> str:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return str(sockname[0]) if sockname else "?"

    async def _slots(self, request: web.Request) -> web.Response:
        self.requests[self._address(request)] += 1
        body = [{"id": 0, "id_task": -1, "n_ctx": 4096, "is_processing": False}]
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def _ok(self, request: web.Request) -> web.Response:
        self.requests[self._address(request)] += 1
        return web.json_response({"status": "ok", "data": [{"id": "stand-in"}]})

    async def start(self, port: int = 0) -> int:
        """Serve on `port` (a free one when 0); the port."""
        app = web.Application()
        app.router.add_get("/slots", self._slots)
        app.router.add_get("/health", self._ok)
        app.router.add_get("/v1/models", self._ok)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock, backlog=1024).start()
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
