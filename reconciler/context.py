"""What the three reconcilers (servers, pools, routers) share: the API server and the
writer in front of it, the watch caches and the lookups across them, the work queue for
the other keys a reconcile wakes, the clock, and the tasks run beside the reconciles
(idle probes, slot saves, Events)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from reconciler import kube as k
from reconciler.kv_slots_io import SlotFiles
from reconciler.lookups import Lookups
from reconciler.metrics import ReconcilerMetrics
from reconciler.probes import IdleProbe
from reconciler.render import Renderer
from reconciler.settings import Settings
from reconciler.settling import Settling
from reconciler.stores import Key, Stores
from reconciler.workqueue import WorkQueue
from reconciler.writes import Writer

log = logging.getLogger(__name__)


async def _quietly(work: Callable[[], Awaitable[None]]) -> None:
    """Run `work()`, logging what it raised: a background task is never left with an
    exception nobody retrieves (and a task cancelled before it ran leaves no coroutine
    that was never awaited)."""
    try:
        await work()
    except asyncio.CancelledError:
        raise
    except k.NamespaceTerminating as e:
        log.info("background task: its namespace is being deleted (%s)", e)
    except Exception:
        log.exception("background task failed")


class Background:
    """Tasks run beside the reconciles (idle probes, Events): a swap's next step never
    waits for an Event to be posted."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def run(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        """Run `work()` beside, logging what it raises."""
        self.start(_quietly(work), name)

    def start(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` beside, as it is (it handles what it raises)."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def stop(self, within: float = 10.0) -> None:
        """Cancel every task and wait (up to `within` seconds) until each has ended, so
        that none still holds a connection when the clients close after it."""
        tasks = list(self.tasks)
        self.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=within)


@dataclass
class Context:
    kube: k.Kube
    settings: Settings
    metrics: ReconcilerMetrics
    renderer: Renderer
    probe: IdleProbe
    clock: Callable[[], float]
    queue: WorkQueue[Key]
    stores: Stores
    writer: Writer
    lookups: Lookups
    settling: Settling
    background: Background = field(default_factory=Background)
    # Why claim pools cannot be served though the API server serves ResourceClaims: this
    # reconciler may not read them (RBAC), in the API server's words.
    claims_refused: str | None = None
    # Saves and restores of members' slots (spec.kvCache); None: none is made.
    slot_files: SlotFiles | None = None

    def add(self, kind: str, namespace: str, name: str) -> None:
        """Queue another key (one this reconcile's outcome concerns)."""
        self.queue.add(Key(kind, namespace, name))
        self.metrics.queue_depth.set(len(self.queue))
