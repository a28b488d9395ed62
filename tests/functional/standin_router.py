"""`python -m tests.functional.standin_router [--fake-kube] ARGS`: the real router process
(flags, signals, servers, config watcher) without a cluster, so process-level tests can
hold requests.

Without `--fake-kube` the activator is the url-only stand-in of `proxy_support`. With it,
the activator is the real `sidecar.activation.Activation` against `FakeKube`, an in-memory
API server: pool `heavy` with `coder` resident, its endpoint the first url backend's
address; a request for any other member is accepted and never served, so it stays held.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from urllib.parse import urlsplit

from sidecar.__main__ import serve
from sidecar.activation import Activation, Changed, Conflict, Listed, WatchEvent
from sidecar.activator import PoolStatus, WriteRequest
from sidecar.config import RouterConfig
from sidecar.endpoints import Endpoint, EndpointSlice
from sidecar.logs import setup_logging
from sidecar.metrics import RouterMetrics
from sidecar.settings import Settings, from_args
from tests.functional.proxy_support import StandInActivation

POOL = "heavy"
RESIDENT = "coder"


class FakeKube:
    def __init__(self, host: str, port: int) -> None:
        self.pool = PoolStatus(POOL, "1", resident_member=RESIDENT)
        self.slice = EndpointSlice(f"{RESIDENT}-x", RESIDENT, port, (Endpoint(host, True),))
        self.watchers: list[asyncio.Queue[WatchEvent[PoolStatus]]] = []

    async def get_pool(self, namespace: str, name: str) -> PoolStatus | None:
        return self.pool

    async def write_request(self, namespace: str, pool: str, write: WriteRequest) -> PoolStatus:
        current = self.pool.request
        expected = write.expected
        if (current is None) != (expected is None) or (
            current is not None
            and expected is not None
            and current.generation != expected.generation
        ):
            raise Conflict("generation moved")
        version = str(int(self.pool.resource_version) + 1)
        self.pool = replace(self.pool, resource_version=version, request=write.request)
        for q in self.watchers:
            q.put_nowait(Changed(self.pool))
        return self.pool

    async def watch_pools(self, namespace: str) -> AsyncIterator[WatchEvent[PoolStatus]]:
        q: asyncio.Queue[WatchEvent[PoolStatus]] = asyncio.Queue()
        self.watchers.append(q)
        yield Listed((self.pool,))
        while True:
            yield await q.get()

    async def watch_endpoint_slices(
        self, namespace: str
    ) -> AsyncIterator[WatchEvent[EndpointSlice]]:
        yield Listed((self.slice,))
        await asyncio.Event().wait()  # no change ever

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[EndpointSlice]:
        return [self.slice] if service == self.slice.service else []


async def standin_activation(
    config: RouterConfig, metrics: RouterMetrics, settings: Settings
) -> StandInActivation:
    return StandInActivation(config, metrics)


async def fake_kube_activation(
    config: RouterConfig, metrics: RouterMetrics, settings: Settings
) -> Activation:
    url = next(b.url for b in config.backends if b.url is not None)
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    kube = FakeKube(parts.hostname, parts.port)
    return Activation(config, kube, metrics, identity=f"test/chat/{settings.pod_name}")


def main() -> None:
    argv = sys.argv[1:]
    fake_kube = "--fake-kube" in argv
    settings = from_args([a for a in argv if a != "--fake-kube"], os.environ)
    setup_logging(settings.log_level)
    asyncio.run(serve(settings, fake_kube_activation if fake_kube else standin_activation))


if __name__ == "__main__":
    main()
