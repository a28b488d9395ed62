"""`python -m tests.functional.standin_router ARGS`: the real router process (flags,
signals, servers, config watcher) with the url-only stand-in activator, so the
process-level tests can hold requests without a cluster."""

from __future__ import annotations

import asyncio
import os
import sys

from sidecar.__main__ import serve
from sidecar.config import RouterConfig
from sidecar.logs import setup_logging
from sidecar.metrics import RouterMetrics
from sidecar.settings import Settings, from_args
from tests.functional.proxy_support import StandInActivation


async def standin_activation(
    config: RouterConfig, metrics: RouterMetrics, settings: Settings
) -> StandInActivation:
    return StandInActivation(config, metrics)


def main() -> None:
    settings = from_args(sys.argv[1:], os.environ)
    setup_logging(settings.log_level)
    asyncio.run(serve(settings, standin_activation))


if __name__ == "__main__":
    main()
