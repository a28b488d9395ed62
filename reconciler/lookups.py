"""The questions one kind asks about another, answered from the watch caches: which
pools hold a server, which routers front it, which pods are a server's, what a claim pool
knows of its device. The reconcilers and the mapping of watch events to keys ask them
alike. Each is answered from an index of its cache (`reconciler.stores`), never by a
scan: what one object's reconcile or watch event costs does not grow with the number of
other objects in the namespace."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconciler import device_claim as dc
from reconciler.objects import meta, pod_active
from reconciler.render import LABEL_SERVER
from reconciler.spec import ModelPoolSpec
from reconciler.stores import BACKEND, MEMBER, Stores


class Lookups:
    def __init__(self, stores: Stores) -> None:
        self.stores = stores

    def pools_of(self, namespace: str, server: str) -> list[str]:
        """The pools that name `server` among their members."""
        return [meta(p)["name"] for p in self.stores.pools.indexed(MEMBER, namespace, server)]

    def pool_for(self, namespace: str, server: str) -> tuple[str | None, bool]:
        """(the pool holding `server`, whether membership is ambiguous)."""
        pools = sorted(self.pools_of(namespace, server))
        if len(pools) > 1:
            return None, True
        return (pools[0] if pools else None), False

    def routers_of(self, namespace: str, servers: Sequence[str]) -> list[str]:
        """The routers with a backend on any of `servers`."""
        found = {meta(r)["name"] for s in set(servers)
                 for r in self.stores.routers.indexed(BACKEND, namespace, s)}
        return sorted(found)

    def pods_of(self, namespace: str, server: str) -> list[dict[str, Any]]:
        """The pods of `server`, by name."""
        return self.stores.pods.indexed(LABEL_SERVER, namespace, server)

    def active_pods_of(self, namespace: str, server: str) -> list[dict[str, Any]]:
        """The pods of `server` that may still hold a GPU (terminating ones too)."""
        return [p for p in self.pods_of(namespace, server) if pod_active(p)]

    def device_of(self, pool: ModelPoolSpec) -> dc.Device | None:
        """A claim pool's device: its ResourceClaim, the device allocated to it and the
        memory the driver publishes for that; None for a pool without a claim, or where
        the API server serves no ResourceClaims."""
        claims, slices = self.stores.claims, self.stores.slices
        if pool.claim is None or claims is None or slices is None:
            return None
        name = dc.claim_name(pool.name)
        device = dc.allocated(claims.get(pool.namespace, name))
        memory = dc.device_memory(slices.items(), device) if device is not None else None
        return dc.Device(name, device, memory)
