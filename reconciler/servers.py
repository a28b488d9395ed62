"""The ModelServer reconciler: render a server's Deployment, Service and NetworkPolicy at
the replicas its pool wants, apply them, prune what it no longer renders, and write its
status from its pods."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler import device_claim as dc
from reconciler.context import Context
from reconciler.footprints import footprints
from reconciler.kv_prune import KvPrune
from reconciler.objects import meta
from reconciler.render import LABEL_SERVER, SERVER_KINDS
from reconciler.server_status import server_status
from reconciler.spec import ModelPoolSpec, ModelServerSpec, SpecError
from reconciler.stores import Key, Result
from reconciler.timefmt import parse

log = logging.getLogger(__name__)

KV_CLAIM_NOT_FOUND = "KvCacheClaimNotFound"
# Rendered servers kept (a handful per server: its replicas 0 and 1, in a pool or not).
RENDER_CACHE_SIZE = 1024

# The replicas a pool wants of each of its members, by (namespace, pool); None while
# that cannot be known (a pool with a problem, not yet stepped).
WantedReplicas = Callable[[str, str], Mapping[str, int] | None]


@dataclass(frozen=True)
class MemberDevice:
    """A budgeted pool's member's footprint, its pool's ResourceClaim and the device's whole
    memory, in bytes (all None outside a budgeted pool, or where not known)."""

    footprint: int | None = None
    claim: str | None = None
    memory: int | None = None


class ServerReconciler:
    def __init__(self, ctx: Context, wanted: WantedReplicas) -> None:
        self.ctx = ctx
        self.wanted = wanted
        self._rendered: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self.kv_prune = KvPrune(ctx)

    async def reconcile(self, key: Key) -> Result:
        """Bring the server to what its spec and its pool want."""
        return await self._reconcile(key, None)

    async def scale(self, key: Key, replicas: int) -> Result:
        """Run a pool's member at `replicas`, as the pool's swap decided."""
        return await self._reconcile(key, replicas)

    async def _reconcile(self, key: Key, scale: int | None) -> Result:
        ctx, writer = self.ctx, self.ctx.writer
        namespace, name = key.namespace, key.name
        body = ctx.stores.servers.get(namespace, name)
        if body is None:
            writer.forget_creation(namespace, name)
            self.kv_prune.server_gone(namespace, name)  # its slot files, from shared claims
            return Result()  # garbage collection removes what it owned
        logger = writer.logger(body, log)
        m = meta(body)
        try:
            spec = ModelServerSpec.from_body(body)
        except SpecError as e:
            await writer.write_stalled(body, logger, "InvalidSpec", str(e))
            return Result()
        missing = self._missing_claim(spec)
        if missing is not None:
            await writer.write_stalled(body, logger, KV_CLAIM_NOT_FOUND, missing)
            return Result()
        pool, ambiguous = ctx.lookups.pool_for(namespace, name)
        if scale is not None:
            replicas, result = scale, Result()
        else:
            replicas, result = self._replicas(spec, pool, ambiguous,
                                              parse(m.get("creationTimestamp")))
        objects = self._render(spec, replicas, m.get("uid"), pool)
        await writer.apply_for(body, logger, objects)
        await writer.prune(SERVER_KINDS, namespace, (LABEL_SERVER, name), m.get("uid"),
                           {(str(o["kind"]), str(o["metadata"]["name"])) for o in objects})
        pods = ctx.lookups.pods_of(namespace, name)
        status = server_status(spec, replicas, pool, ambiguous, pods,
                               ctx.stores.deployments.get(namespace, name) or {},
                               body.get("status"), ctx.clock())
        if status.stalled is not None:
            await writer.warn_once(body, logger, status.stalled)
        await writer.write_status(ctx.stores.servers, body, status.owned)
        self.kv_prune.sync(spec, pods, logger)
        return result.sooner(
            await writer.retry_creation(namespace, name, status.not_created, logger))

    def _missing_claim(self, spec: ModelServerSpec) -> str | None:
        """Why the claim a persisted member names cannot hold its slots: it does not
        exist (a claim the reconciler creates is never missing). Looked at again when a
        claim comes (`Controller._on_claim`)."""
        kv = spec.kv_cache
        if (kv is None or not kv.persist or kv.pvc is None
                or self.ctx.stores.volume_claims.get(spec.namespace, kv.pvc) is not None):
            return None
        return (f"spec.kvCache.pvc names the PersistentVolumeClaim {kv.pvc}, which does not "
                f"exist in {spec.namespace}: create it, or name a storageClassName instead")

    def _replicas(
        self, spec: ModelServerSpec, pool: str | None, ambiguous: bool, created: float | None
    ) -> tuple[int, Result]:
        """A pool member's replicas are what its pool's swap wants; while that cannot be
        known (a member of two pools, a pool with a problem, not yet stepped) whatever runs
        keeps running: nothing is scaled. A server in no pool runs at spec.replicas, but
        not in its first seconds: a pool applied together with it (kubectl apply -k, a
        GitOps sync) may reach the reconciler a moment later and must claim it before it
        loads, or two members would start at once (the server is looked at again then)."""
        live = self.ctx.stores.deployments.get(spec.namespace, spec.name)
        live_replicas = int(((live or {}).get("spec") or {}).get("replicas") or 0)
        if pool is None and not ambiguous:
            settle = self.ctx.settings.swap.standalone_settle_seconds
            age = self.ctx.clock() - created if created is not None else settle
            if age < settle:
                return min(spec.replicas, live_replicas), Result(settle - age)
            return spec.replicas, Result()
        wanted = self.wanted(spec.namespace, pool) if pool else None
        if wanted is not None and spec.name in wanted:
            return wanted[spec.name], Result()
        return live_replicas, Result()

    def _device(self, spec: ModelServerSpec, pool: str | None) -> MemberDevice:
        """What a member of a budgeted pool is rendered with: its footprint, the pool's
        ResourceClaim (a claim pool's, where the API server serves them) and the whole
        memory of the device (a vLLM member's share is a fraction of it)."""
        if pool is None:
            return MemberDevice()
        try:
            pool_spec = ModelPoolSpec.from_body(self.ctx.stores.pools.get(spec.namespace, pool)
                                                or {})
        except SpecError:
            return MemberDevice()
        if not pool_spec.budgeted:
            return MemberDevice()
        device = self.ctx.lookups.device_of(pool_spec)
        return MemberDevice(footprints(pool_spec, {spec.name: spec}).get(spec.name),
                            device.claim if device is not None else None,
                            dc.share_memory(pool_spec, device))

    def _render(self, spec: ModelServerSpec, replicas: int, owner_uid: str | None,
                pool: str | None) -> list[dict[str, Any]]:
        """A server's objects, rendered once per (spec generation, replicas, pool): every
        pod event reconciles its server, and a swap's scale-up should not wait for the
        templates to be rendered again to the same output."""
        routers = tuple(sorted(self.ctx.lookups.routers_of(spec.namespace, [spec.name])))
        device = self._device(spec, pool)
        key = (spec.namespace, spec.name, spec.uid, spec.generation, replicas, owner_uid, pool,
               routers, device)
        objects = self._rendered.get(key)
        if objects is None:
            objects = self.ctx.renderer.model_server(
                spec, replicas=replicas, owner_uid=owner_uid, pool=pool, routers=routers,
                gpu_footprint=device.footprint, device_claim=device.claim,
                device_memory=device.memory)
            if len(self._rendered) >= RENDER_CACHE_SIZE:
                self._rendered.clear()
            self._rendered[key] = objects
        return copy.deepcopy(objects)
