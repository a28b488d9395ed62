"""One in-memory API server for the router: `FakeCluster`, an implementation of
`sidecar.kube_port.KubePort` with the contract's compare-and-swap semantics
(docs/contracts.md section 2).

The functional tests, the stand-in router process and the router benchmark play the
reconciler by editing its pool status and EndpointSlices; several `Activation`s may share
one, to stand for several router replicas. The real API server is exercised in
tests/integration/test_router_kube.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from dataclasses import replace
from typing import Any

from sidecar.activator import PoolStatus, WriteRequest
from sidecar.endpoints import Endpoint, EndpointSlice
from sidecar.kube_port import Changed, Conflict, Deleted, Listed, WatchEvent


class FakeCluster:
    """Pools and EndpointSlices of one namespace, with watches and CAS writes."""

    def __init__(self, *, write_delay: float = 0.001) -> None:
        # How long a write takes: by default long enough for writers from several routers
        # to interleave.
        self.write_delay = write_delay
        self.rv = 100
        self.pools: dict[str, PoolStatus] = {}
        self.slices: dict[str, EndpointSlice] = {}
        self.writes: list[WriteRequest] = []  # successful ones, in order
        self.attempts: list[WriteRequest] = []  # every write sent, as it arrives
        # While set and not released, writes wait at it: a test can hold one in flight.
        self.write_gate: asyncio.Event | None = None
        self.conflicts = 0
        self.reads = 0
        self.slice_lists = 0
        self._pool_watchers: list[asyncio.Queue[WatchEvent[PoolStatus]]] = []
        # The pool each pool watch asked for (None: every pool of the namespace), in order.
        self.pool_watches: list[str | None] = []
        self._pool_selection: dict[int, str | None] = {}  # by id() of a watcher's queue
        self._slice_watchers: list[asyncio.Queue[WatchEvent[EndpointSlice]]] = []
        # The services each slice watch asked for (None: every Service), in order.
        self.slice_watches: list[frozenset[str] | None] = []

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # --- the reconciler's side, played by the tests ---

    def set_pool(self, name: str, **changes: Any) -> PoolStatus:
        old = self.pools.get(name) or PoolStatus(name, "0")
        status = replace(old, resource_version=self._next_rv(), **changes)
        self.pools[name] = status
        for q in self._pool_watchers:
            if self._pool_selection[id(q)] in (None, name):
                q.put_nowait(Changed(status))
        return status

    def set_endpoints(
        self, service: str, *addresses: str, ready: bool = True, port: int = 8080
    ) -> None:
        s = EndpointSlice(
            f"{service}-abc", service, port, tuple(Endpoint(a, ready) for a in addresses)
        )
        self.slices[s.name] = s
        for q in self._slice_watchers:
            q.put_nowait(Changed(s))

    def delete_endpoints(self, service: str) -> None:
        del self.slices[f"{service}-abc"]
        for q in self._slice_watchers:
            q.put_nowait(Deleted(f"{service}-abc"))

    def delivered(self) -> bool:
        """Every watch event sent so far has been taken, and so handled, by its router
        (a router handles a watch event in the step that takes it off the queue)."""
        pools = all(q.empty() for q in self._pool_watchers)
        slices = all(q.empty() for q in self._slice_watchers)
        return bool(self._pool_watchers) and pools and slices

    def requests_for(self, member: str | None) -> list[WriteRequest]:
        return [w for w in self.writes if w.request.member == member]

    # --- KubePort ---

    async def get_pool(self, namespace: str, name: str) -> PoolStatus | None:
        await asyncio.sleep(0)
        self.reads += 1
        return self.pools.get(name)

    async def write_request(self, namespace: str, pool: str, write: WriteRequest) -> PoolStatus:
        self.attempts.append(write)
        if self.write_gate is not None:
            await self.write_gate.wait()
        if self.write_delay:
            await asyncio.sleep(self.write_delay)
        current = self.pools[pool]
        if write.expected is not None:
            if current.request is None or current.request.generation != write.expected.generation:
                self.conflicts += 1
                raise Conflict("test /status/request/generation failed")
        elif current.resource_version != write.resource_version:
            self.conflicts += 1
            raise Conflict("test /metadata/resourceVersion failed")
        self.writes.append(write)
        return self.set_pool(pool, request=write.request, status_present=True)

    async def watch_pools(
        self, namespace: str, name: str | None = None
    ) -> AsyncIterator[WatchEvent[PoolStatus]]:
        """As the API server filters by field: only the pool `name` when given."""
        self.pool_watches.append(name)
        q: asyncio.Queue[WatchEvent[PoolStatus]] = asyncio.Queue()
        self._pool_watchers.append(q)
        self._pool_selection[id(q)] = name
        try:
            yield Listed(tuple(p for p in self.pools.values() if name in (None, p.name)))
            while True:
                yield await q.get()
        finally:
            self._pool_watchers.remove(q)
            del self._pool_selection[id(q)]

    async def watch_endpoint_slices(
        self, namespace: str, services: Collection[str] | None = None
    ) -> AsyncIterator[WatchEvent[EndpointSlice]]:
        """As the API server filters by label: only the slices of `services` when given."""
        self.slice_watches.append(None if services is None else frozenset(services))
        q: asyncio.Queue[WatchEvent[EndpointSlice]] = asyncio.Queue()
        self._slice_watchers.append(q)

        def wanted(s: EndpointSlice) -> bool:
            return services is None or s.service in services

        try:
            yield Listed(tuple(s for s in self.slices.values() if wanted(s)))
            while True:
                event = await q.get()
                if isinstance(event, Changed) and not wanted(event.item):
                    continue
                yield event
        finally:
            self._slice_watchers.remove(q)

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[EndpointSlice]:
        await asyncio.sleep(0)
        self.slice_lists += 1
        return [s for s in self.slices.values() if s.service == service]
