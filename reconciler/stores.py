"""What the reconcilers share about the objects they watch: the three kinds of keys, the
result of one reconcile, and the caches the watches keep current (one per resource)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler import kube as k
from reconciler.render import LABEL_POOL, LABEL_ROUTER, LABEL_SERVER, MANAGED_BY

SERVER = "ModelServer"
POOL = "ModelPool"
ROUTER = "ModelRouter"
MANAGED = f"app.kubernetes.io/managed-by={MANAGED_BY}"

# The indexes of the caches: a pool by its members' names, a router by the ModelServers its
# backends name, and what the reconciler rendered (and the pods of it) by the server,
# router or pool label it carries.
MEMBER = "member"
BACKEND = "backend"


def pool_members(obj: Mapping[str, Any]) -> Iterable[str]:
    members = (obj.get("spec") or {}).get("members") or []
    return [m["name"] for m in members
            if isinstance(m, Mapping) and isinstance(m.get("name"), str) and m["name"]]


def router_backends(obj: Mapping[str, Any]) -> Iterable[str]:
    backends = (obj.get("spec") or {}).get("backends") or []
    refs = [(b.get("modelServerRef") or {}).get("name") for b in backends
            if isinstance(b, Mapping)]
    return [r for r in refs if isinstance(r, str) and r]


POOL_INDEXERS: dict[str, k.Indexer] = {MEMBER: pool_members}
ROUTER_INDEXERS: dict[str, k.Indexer] = {BACKEND: router_backends}
OWNED_INDEXERS: dict[str, k.Indexer] = {
    LABEL_SERVER: k.label_indexer(LABEL_SERVER),
    LABEL_ROUTER: k.label_indexer(LABEL_ROUTER),
    LABEL_POOL: k.label_indexer(LABEL_POOL),
}


@dataclass(frozen=True)
class Key:
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of the queue: to look at its key again after
    `requeue_after` seconds (None: only when something it watches changes)."""

    requeue_after: float | None = None

    def sooner(self, after: float | None) -> Result:
        """This result, or one asking to come back after `after` if that is earlier."""
        if after is None or (self.requeue_after is not None and self.requeue_after <= after):
            return self
        return Result(after)


@dataclass(frozen=True)
class Stores:
    """The watch caches, by resource."""

    servers: k.Informer
    pools: k.Informer
    routers: k.Informer
    deployments: k.Informer
    services: k.Informer
    config_maps: k.Informer
    service_accounts: k.Informer
    roles: k.Informer
    role_bindings: k.Informer
    network_policies: k.Informer
    pods: k.Informer
    # Every PersistentVolumeClaim of the namespace: those the reconciler creates for a
    # member's saved slots, and those a member names (it is Stalled while its claim
    # does not exist).
    volume_claims: k.Informer
    # Dynamic Resource Allocation's, where the API server serves it (else None): the claim
    # pools' ResourceClaims, and the ResourceSlices and DeviceClasses of the cluster.
    claims: k.Informer | None = None
    slices: k.Informer | None = None
    device_classes: k.Informer | None = None

    def all(self) -> list[k.Informer]:
        return [
            self.servers, self.pools, self.routers, self.deployments, self.services,
            self.config_maps, self.service_accounts, self.roles, self.role_bindings,
            self.network_policies, self.pods, self.volume_claims,
            *(i for i in (self.claims, self.slices, self.device_classes) if i is not None),
        ]

    def of_kind(self, api_version: str, kind: str) -> k.Informer | None:
        """The cache of the objects the reconciler renders of this kind, if it keeps one
        (then what it applies is compared with the cache, and written back into it)."""
        return self._rendered.get((api_version, kind))

    @functools.cached_property
    def _rendered(self) -> dict[tuple[str, str], k.Informer]:
        claims = {} if self.claims is None else {
            (k.RESOURCE_CLAIMS.api_version, "ResourceClaim"): self.claims}
        return {
            **claims,
            ("apps/v1", "Deployment"): self.deployments,
            ("v1", "Service"): self.services,
            ("v1", "ConfigMap"): self.config_maps,
            ("v1", "ServiceAccount"): self.service_accounts,
            (k.ROLES.api_version, "Role"): self.roles,
            (k.ROLE_BINDINGS.api_version, "RoleBinding"): self.role_bindings,
            (k.NETWORK_POLICIES.api_version, "NetworkPolicy"): self.network_policies,
            (k.VOLUME_CLAIMS.api_version, "PersistentVolumeClaim"): self.volume_claims,
        }
