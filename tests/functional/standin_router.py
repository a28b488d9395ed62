"""`python -m tests.functional.standin_router [--fake-kube] ARGS`: the real router process
(flags, signals, servers, config watcher) without a cluster, so process-level tests can
hold requests.

Without `--fake-kube` the activator is the url-only stand-in of `proxy_support`. With it,
the activator is the real `sidecar.activation.Activation` against `tests.kube_fake`'s
in-memory API server: pool `heavy` with `coder` resident, its endpoint the first url
backend's address; a request for any other member is accepted and never served, so it
stays held.
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

from sidecar.__main__ import ActivationFactory
from sidecar.__main__ import main as router_main
from sidecar.activation import Activation
from sidecar.config import RouterConfig
from sidecar.metrics import RouterMetrics
from sidecar.settings import Settings
from tests.functional.proxy_support import StandInActivation
from tests.kube_fake import FakeCluster

POOL = "heavy"
RESIDENT = "coder"


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
    kube = FakeCluster(write_delay=0.0)
    kube.set_pool(POOL, resident_member=RESIDENT)
    kube.set_endpoints(RESIDENT, parts.hostname, port=parts.port)
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
