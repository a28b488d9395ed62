"""Ready (and not-yet-ready) pod addresses per Service, from EndpointSlices.

The router dispatches straight to pod addresses (no DNS, no kube-proxy) so it sees a
member become ready the moment its EndpointSlice says so. A connection failure marks one
address bad for a short while, so the next request does not walk into the same dead pod
before the slice catches up; the mark goes when the slice changes or after `bad_ttl`.
Not-ready addresses are kept beside the ready ones: a pod is listed with
`conditions.ready: false` once it has an IP, and the activator probes a swap's target there
before the kubelet marks it Ready. No I/O: `sidecar.kube` feeds the slices, the shell
passes the time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    address: str
    ready: bool


@dataclass(frozen=True)
class EndpointSlice:
    name: str
    service: str
    port: int | None  # the port named `http`, else the first port
    endpoints: tuple[Endpoint, ...]


class EndpointIndex:
    """EndpointSlices of one namespace, indexed by Service name."""

    def __init__(self, *, bad_ttl: float = 5.0) -> None:
        self._slices: dict[str, EndpointSlice] = {}
        self._bad: dict[tuple[str, str], float] = {}  # (service, address) -> until
        self._bad_ttl = bad_ttl
        self._turn = itertools.count()

    def replace_all(self, slices: Iterable[EndpointSlice]) -> None:
        self._slices = {s.name: s for s in slices}
        self._bad.clear()

    def replace_service(self, service: str, slices: Iterable[EndpointSlice]) -> None:
        """A fresh list of one Service's slices (a re-read after a connection failure)."""
        fresh = {s.name: s for s in slices}
        for name in [n for n, s in self._slices.items() if s.service == service]:
            if name not in fresh:
                self.delete(name)
        for s in fresh.values():
            self.upsert(s)

    def upsert(self, s: EndpointSlice) -> None:
        old = self._slices.get(s.name)
        self._slices[s.name] = s
        if old is not None and old.endpoints != s.endpoints:
            self._clear_bad(s.service)

    def delete(self, name: str) -> None:
        old = self._slices.pop(name, None)
        if old is not None:
            self._clear_bad(old.service)

    def _clear_bad(self, service: str) -> None:
        for key in [k for k in self._bad if k[0] == service]:
            del self._bad[key]

    def mark_bad(self, service: str, address: str, now: float) -> None:
        """`address` is `host:port`, as `ready_addresses` returns it."""
        self._bad[(service, address)] = now + self._bad_ttl

    def ready_addresses(
        self, service: str, now: float, default_port: int | None = None
    ) -> list[str]:
        """`host:port` of every ready endpoint of `service` not marked bad, sorted."""
        return self._addresses(service, now, default_port, ready=True)

    def not_ready_addresses(
        self, service: str, now: float, default_port: int | None = None
    ) -> list[str]:
        """`host:port` of every endpoint of `service` listed but not ready, not marked bad,
        sorted (minus any address another slice lists as ready)."""
        ready = set(self._addresses(service, now, default_port, ready=True))
        return [
            a for a in self._addresses(service, now, default_port, ready=False) if a not in ready
        ]

    def _addresses(
        self, service: str, now: float, default_port: int | None, *, ready: bool
    ) -> list[str]:
        found: set[str] = set()
        for s in self._slices.values():
            port = s.port if s.port is not None else default_port
            if s.service != service or port is None:
                continue
            for e in s.endpoints:
                if e.ready != ready:
                    continue
                address = _join(e.address, port)
                until = self._bad.get((service, address))
                if until is None or now >= until:
                    found.add(address)
        return sorted(found)

    def pick(self, service: str, now: float, default_port: int | None = None) -> str | None:
        """One ready address, round robin."""
        addresses = self.ready_addresses(service, now, default_port)
        if not addresses:
            return None
        return addresses[next(self._turn) % len(addresses)]

    def next_expiry(self, now: float) -> float | None:
        return min((t for t in self._bad.values() if t > now), default=None)

    def services(self) -> set[str]:
        return {s.service for s in self._slices.values()}


def _join(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
