"""`python -m e2e.device_plugin`: the fake GPU plugin of one node (NODE_NAME from the
downward API), until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from e2e.device_plugin import devices, server


async def main() -> None:
    node = os.environ["NODE_NAME"]
    labels = server.node_labels(node)
    count = devices.device_count(labels)
    how = devices.sharing(labels)
    ids = devices.device_ids(count)
    server.make_locks(ids, Path(devices.HOST_LOCK_DIR))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger("fake-gpu-plugin").info(
        "node %s: %d fake %s, each advertised %d times, memory %s", node, count,
        devices.RESOURCE, how.shares, how.memory)
    await server.serve(devices.advertised_ids(count, how), server.PLUGIN_DIR, stop, how)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main())
