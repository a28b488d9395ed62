"""The fake server's entry point and lifecycle: read flags and environment once, take the
GPU locks, serve until SIGTERM, then drain in-flight requests, wait the unload time and
release the GPU.

Exit codes: 0 after a clean shutdown, 2 for a bad command line or environment, 3 when a GPU
is already held by another server, 4 when the address cannot be bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from e2e.fake_model.app import ServerState, build_app
from e2e.fake_model.gpu_ledger import GpuLedger, GpuMemoryExhausted
from e2e.fake_model.gpu_lock import GpuInUseError, GpuLocks
from e2e.fake_model.settings import Settings, SettingsError, parse_settings

logger = logging.getLogger(__name__)

EXIT_BAD_SETTINGS = 2
EXIT_GPU_IN_USE = 3
EXIT_CANNOT_LISTEN = 4
# Longest a SIGTERM waits for in-flight generations; the kubelet's grace period is the
# real bound.
DRAIN_TIMEOUT_SECONDS = 600.0


def seconds_since_exec() -> float:
    """How long ago this process started, from /proc (Linux); 0 where that is unknown."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # Field 22 (starttime, in clock ticks since boot) counted after the ")" that ends
        # the command name, which may itself hold spaces.
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        ticks_per_second = os.sysconf("SC_CLK_TCK")
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
    # starttime is rounded down to a whole tick, so the process may be up to one tick
    # younger than it reads: count only what has surely been spent.
    return max(0.0, now - (start_ticks + 1) / ticks_per_second)


async def serve(settings: Settings, already_spent: float = 0.0) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, finish what is in flight and
    wait the unload time. ``already_spent`` is how long the process took to get here."""
    state = ServerState(settings)
    runner = web.AppRunner(
        build_app(state), handle_signals=False, shutdown_timeout=DRAIN_TIMEOUT_SECONDS
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        logger.info(
            "fake %s server for %s listening on %s:%s",
            settings.mode.value,
            settings.model_id,
            settings.host,
            settings.port,
        )
        async with asyncio.TaskGroup() as group:
            loading = group.create_task(state.load(already_spent))
            await stop.wait()
            loading.cancel()
        logger.info("stopping: finishing in-flight requests")
    finally:
        await runner.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    if settings.unload_time > 0:
        logger.info("unloading for %.1fs", settings.unload_time)
        await asyncio.sleep(settings.unload_time)


def gpu_hold(settings: Settings) -> GpuLocks | GpuLedger | None:
    """The server's hold on its devices: a charge on each one's ledger when the device is
    shared (it has a memory), an exclusive lock otherwise; None without a lock directory."""
    if settings.gpu_lock_dir is None:
        return None
    if settings.gpu_memory is not None and settings.gpu_footprint is not None:
        return GpuLedger(settings.gpu_lock_dir, settings.gpu_ids, settings.gpu_footprint,
                         settings.gpu_memory)
    return GpuLocks(settings.gpu_lock_dir, settings.gpu_ids)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as e:
        logger.error("%s", e)
        return EXIT_BAD_SETTINGS
    if settings.ignored_args:
        logger.info("ignoring arguments: %s", " ".join(settings.ignored_args))

    locks = gpu_hold(settings)
    if locks is None and settings.gpu_ids:
        logger.warning("NVIDIA_VISIBLE_DEVICES is set but MODELPOOL_GPU_LOCK_DIR is not: no lock")
    try:
        if locks is not None:
            locks.acquire()
        asyncio.run(serve(settings, seconds_since_exec()))
    except (GpuInUseError, GpuMemoryExhausted) as e:
        logger.error("%s", e)
        return EXIT_GPU_IN_USE
    except OSError as e:
        logger.error("cannot serve on %s:%s: %s", settings.host, settings.port, e)
        return EXIT_CANNOT_LISTEN
    finally:
        if locks is not None:
            locks.release()
    logger.info("stopped")
    return 0
