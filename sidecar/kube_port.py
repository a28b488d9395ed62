"""The router's port to the API server: what the activation and the config watcher need of
it, and the events its watches yield.

`sidecar.kube` implements it against the API server; the tests and the benchmarks use one
in-memory fake of it (`tests.kube_fake`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from sidecar.activator import PoolStatus, WriteRequest
from sidecar.endpoints import EndpointSlice

T = TypeVar("T")


class KubeError(Exception):
    """The API server could not be reached, or refused for a reason worth retrying."""


class Conflict(KubeError):
    """A compare-and-swap write lost its race (HTTP 422 from a failed `test`, or 409)."""


@dataclass(frozen=True)
class Listed(Generic[T]):
    """A fresh list: replaces everything known (at start, and after the watch expired)."""

    items: tuple[T, ...]


@dataclass(frozen=True)
class Changed(Generic[T]):
    item: T


@dataclass(frozen=True)
class Deleted:
    name: str


WatchEvent = Listed[T] | Changed[T] | Deleted


class KubePort(Protocol):
    """What the shell needs of the API server. Watches never end on their own: they list,
    watch, resume, and list again after 410 Gone."""

    async def get_pool(self, namespace: str, name: str) -> PoolStatus | None: ...

    async def write_request(self, namespace: str, pool: str, write: WriteRequest) -> PoolStatus:
        """CAS-write `status.request` as docs/contracts.md section 2 says; raises Conflict."""
        ...

    def watch_pools(
        self, namespace: str, name: str | None = None
    ) -> AsyncIterator[WatchEvent[PoolStatus]]:
        """The ModelPool `name` alone when given (a field selector), else every ModelPool
        of the namespace."""
        ...

    def watch_endpoint_slices(
        self, namespace: str, services: Collection[str] | None = None
    ) -> AsyncIterator[WatchEvent[EndpointSlice]]:
        """The namespace's EndpointSlices, or only those of `services` when given."""
        ...

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[EndpointSlice]: ...

