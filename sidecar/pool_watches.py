"""The router's watches of the ModelPools it fronts.

A router reads the status of its own pools only: one watch per pool, selected by name (a
field selector on `metadata.name`, which the API server filters), so a namespace of
hundreds of pools sends each router the changes of its few. A router fronting more than
`MAX_NAMED_POOLS` pools watches the whole namespace instead, with one watch.

`PoolWatches.sync` starts the watches the pools of the configuration need and stops those
it no longer needs; every event goes to one handler with the name its watch selects (None
for the namespace's watch), so a watch's `Listed` replaces what that watch covers alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from sidecar.activator import PoolStatus
from sidecar.kube_port import KubePort, Listed, WatchEvent

# Past this many pools, one watch of the namespace costs the API server less than a
# watch per pool.
MAX_NAMED_POOLS = 16

Handler = Callable[[str | None, WatchEvent[PoolStatus]], None]


def selections(pools: Collection[str]) -> frozenset[str | None]:
    """What to watch for `pools`: each by name, or the whole namespace (None) past
    MAX_NAMED_POOLS."""
    if len(pools) > MAX_NAMED_POOLS:
        return frozenset({None})
    return frozenset(pools)


class PoolWatches:
    """The running pool watches of one router, each a task of the router's task group."""

    def __init__(self, kube: KubePort, namespace: str, handle: Handler) -> None:
        self._kube = kube
        self._namespace = namespace
        self._handle = handle
        self._tasks: dict[str | None, asyncio.Task[None]] = {}
        self._listed: set[str | None] = set()

    def sync(self, group: asyncio.TaskGroup, pools: Collection[str]) -> list[str | None]:
        """Watch what `pools` need, in `group`; stop the rest. Returns the selections
        stopped (their pools' statuses are no longer followed)."""
        wanted = selections(pools)
        stopped = [s for s in self._tasks if s not in wanted]
        for selection in stopped:
            self._tasks.pop(selection).cancel()
            self._listed.discard(selection)
        for selection in wanted - self._tasks.keys():
            self._tasks[selection] = group.create_task(self._watch(selection))
        return stopped

    def listed(self) -> bool:
        """Every running watch has listed once (true with none: a router of no pool)."""
        return self._listed >= self._tasks.keys()

    def selections(self) -> frozenset[str | None]:
        return frozenset(self._tasks)

    def clear(self) -> None:
        """Forget the tasks (their task group has cancelled them)."""
        self._tasks.clear()
        self._listed.clear()

    async def _watch(self, selection: str | None) -> None:
        async for event in self._kube.watch_pools(self._namespace, selection):
            if isinstance(event, Listed):
                self._listed.add(selection)
            self._handle(selection, event)
