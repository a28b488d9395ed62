"""Every ConfigMap and Secret of the cluster, kept current by a watch.

The kubelet serves ConfigMap and Secret volumes from a watch-fed cache; so does the
agent. Pod workers read objects from here and wait on `changed` to rewrite their
volumes as soon as an object they mount changes, instead of polling the API server.
An object the cache has not seen (created a moment ago, or before the first list) is
fetched directly, so a cache miss is never mistaken for absence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from e2e.local.node_agent.kube import ApiError, Json, Kube
from kubecore import watch

logger = logging.getLogger(__name__)

KINDS = ("configmaps", "secrets")


class ObjectCache:
    def __init__(self, kube: Kube, retry_seconds: float = 1.0) -> None:
        self._kube = kube
        self._retry = retry_seconds
        self._objects: dict[tuple[str, str, str], Json] = {}
        # Bumped on every change; waiters compare it with the value they last saw.
        self.version = 0
        self._changed = asyncio.Condition()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for kind in KINDS:
                group.create_task(self._follow(kind))

    async def get(self, plural: str, namespace: str, name: str) -> Json | None:
        found = self._objects.get((plural, namespace, name))
        if found is not None:
            return found
        return await self._kube.get("v1", f"namespaces/{namespace}/{plural}/{name}")

    async def wait_for_change(self, seen: int, at_most: float) -> int:
        """Wait until `version` moves past `seen` or `at_most` seconds pass; the new
        version."""
        async with self._changed:
            try:
                async with asyncio.timeout(at_most):
                    await self._changed.wait_for(lambda: self.version != seen)
            except TimeoutError:
                pass
            return self.version

    async def _bump(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def _follow(self, plural: str) -> None:
        retry = watch.Retry(delay=lambda _: self._retry, failures=(ApiError,))
        changes = watch.list_then_watch(
            lambda: self._kube.list(plural),
            lambda version: self._kube.watch(plural, version),
            what=plural,
            retry=retry,
            logger=logger,
        )
        async with watch.closing(changes):
            async for change in changes:
                if isinstance(change, watch.Listed):
                    self._relisted(plural, change.items)
                else:
                    self._apply(plural, change)
                await self._bump()

    def _relisted(self, plural: str, items: Sequence[Json]) -> None:
        fresh = {(plural, o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}
        for key in [k for k in self._objects if k[0] == plural]:
            self._objects.pop(key)
        self._objects.update(fresh)

    def _apply(self, plural: str, change: watch.Event) -> None:
        meta = change.object["metadata"]
        key = (plural, meta["namespace"], meta["name"])
        if change.type == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = change.object
