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
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from urllib.parse import urlsplit

from sidecar.__main__ import ActivationFactory
from sidecar.__main__ import main as router_main
from sidecar.activation import Activation
from sidecar.activator import PoolStatus, WriteRequest
from sidecar.config import RouterConfig
from sidecar.endpoints import Endpoint, EndpointSlice
from sidecar.kube_port import Changed, Conflict, Listed, WatchEvent
from sidecar.metrics import RouterMetrics
from sidecar.settings import Settings
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


class CrashingActivation(StandInActivation):
    async def run(self) -> None:
        await asyncio.sleep(0.5)
        raise RuntimeError("activation broke")


async def crashing_activation(
    config: RouterConfig, metrics: RouterMetrics, settings: Settings
) -> StandInActivation:
    return CrashingActivation(config, metrics)


MODES: dict[str, ActivationFactory] = {
    "--fake-kube": fake_kube_activation,
    "--crash-activation": crashing_activation,
}


def main() -> None:
    """`--fake-kube`: the real Activation; `--crash-activation`: its run() fails soon."""
    argv = sys.argv[1:]
    factory = next((MODES[a] for a in argv if a in MODES), standin_activation)
    router_main([a for a in argv if a not in MODES], factory)


if __name__ == "__main__":
    main()
