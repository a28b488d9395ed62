"""The reconciler's shell: watches feed caches and a work queue; workers take one key at a
time and hand it to the reconciler of its kind.

Three kinds of keys go through one queue: a ModelServer (`reconciler.servers`: its
Deployment and Service, at the replicas its pool wants), a ModelPool (`reconciler.pools`:
one step of its swap state machine, whose actions it executes) and a ModelRouter
(`reconciler.routers`: its Deployment, ServiceAccount, Role, RoleBinding, Service and
ConfigMap). Every watched change maps to the keys it concerns: a pod of a member wakes its
server and its pool, a hand-edited Deployment wakes its owner, which applies it back.
Nothing is done on a timer except what a reconcile asks for in its result (the swap's
`next_wakeup`, the retry of a Deployment whose pods cannot be created), and nothing is
written unless it differs from what the API server holds (`reconciler.writes`), so an
idle reconciler makes no writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler import kube as k
from reconciler.context import Context
from reconciler.kv_slots_io import SlotFiles
from reconciler.lookups import Lookups
from reconciler.metrics import ReconcilerMetrics
from reconciler.objects import labels, meta
from reconciler.pools import PoolReconciler
from reconciler.prewarm import Prewarm
from reconciler.probes import IdleProbe
from reconciler.render import LABEL_POOL, LABEL_ROUTER, LABEL_SERVER, Renderer, RenderError
from reconciler.routers import RouterReconciler
from reconciler.servers import ServerReconciler
from reconciler.settings import Settings
from reconciler.settling import Settling
from reconciler.spec import KV_CLAIM_SUFFIX, SpecError
from reconciler.stores import (
    MANAGED,
    OWNED_INDEXERS,
    POOL,
    POOL_INDEXERS,
    ROUTER,
    ROUTER_INDEXERS,
    SERVER,
    Key,
    Result,
    Stores,
    pool_members,
)
from reconciler.workqueue import QueueShutDown, WorkQueue
from reconciler.writes import Writer

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        kube: k.Kube,
        settings: Settings,
        metrics: ReconcilerMetrics,
        renderer: Renderer,
        probe: IdleProbe,
        clock: Callable[[], float] = time.time,
        ready: asyncio.Event | None = None,
        claims_served: bool = False,
        claims_refused: str | None = None,
        slot_files: SlotFiles | None = None,
    ) -> None:
        """`ready` is set once the caches are synced (the health server's /readyz reads
        it, and may be serving before this controller exists). `claims_served`: the API
        server serves Dynamic Resource Allocation (`resource.k8s.io/v1`), so claim pools'
        ResourceClaims and the devices drivers publish are watched; without it a claim
        pool is stalled (`reconciler.device_claim`), saying `claims_refused` where the API
        server serves them but this reconciler may not read them."""
        self.settings = settings
        self.metrics = metrics
        # A pool's swap steps go ahead of servers' and routers' status (`reconciler.workqueue`).
        self.queue: WorkQueue[Key] = WorkQueue(urgent=lambda key: key.kind == POOL)
        ns = settings.namespace
        self.servers = k.Informer(kube, k.MODEL_SERVERS, ns, self._on_server)
        self.pools = k.Informer(kube, k.MODEL_POOLS, ns, self._on_pool, indexers=POOL_INDEXERS)
        self.routers = k.Informer(kube, k.MODEL_ROUTERS, ns, self._on_router,
                                  indexers=ROUTER_INDEXERS)

        def owned(resource: k.Resource, on_change: k.OnChange) -> k.Informer:
            return k.Informer(kube, resource, ns, on_change, MANAGED, indexers=OWNED_INDEXERS)

        self.deployments = owned(k.DEPLOYMENTS, self._on_deployment)
        # A router's identity and RBAC are cached like the rest, so a router reconciled
        # again applies them only when they differ from what runs.
        stores = Stores(
            servers=self.servers,
            pools=self.pools,
            routers=self.routers,
            deployments=self.deployments,
            services=owned(k.SERVICES, self._on_owned),
            config_maps=owned(k.CONFIG_MAPS, self._on_owned),
            service_accounts=owned(k.SERVICE_ACCOUNTS, self._on_owned),
            roles=owned(k.ROLES, self._on_owned),
            role_bindings=owned(k.ROLE_BINDINGS, self._on_owned),
            network_policies=owned(k.NETWORK_POLICIES, self._on_owned),
            pods=k.Informer(kube, k.PODS, ns, self._on_pod, LABEL_SERVER,
                            indexers=OWNED_INDEXERS),
            **({
                "claims": owned(k.RESOURCE_CLAIMS, self._on_claim),
                "slices": k.Informer(kube, k.RESOURCE_SLICES, None, self._on_devices),
                "device_classes": k.Informer(kube, k.DEVICE_CLASSES, None, self._on_devices),
            } if claims_served else {}),
            volume_claims=k.Informer(kube, k.VOLUME_CLAIMS, ns, self._on_volume_claim,
                                     indexers=OWNED_INDEXERS),
        )
        self.pods = stores.pods
        self.informers = stores.all()
        self.lookups = Lookups(stores)
        self.ctx = Context(
            kube=kube, settings=settings, metrics=metrics, renderer=renderer, probe=probe,
            clock=clock, queue=self.queue, stores=stores, lookups=self.lookups,
            writer=Writer(kube, metrics, stores, clock, settings.leader.identity,
                          settings.create_retry_seconds),
            settling=Settling(clock, settings.swap.standalone_settle_seconds),
            claims_refused=claims_refused,
            slot_files=slot_files,
        )
        self.pool_reconciler: PoolReconciler
        self.server_reconciler = ServerReconciler(
            self.ctx, lambda namespace, pool: self.pool_reconciler.wanted(namespace, pool))
        self.pool_reconciler = PoolReconciler(self.ctx, self.server_reconciler,
                                              Prewarm(self.ctx))
        self.router_reconciler = RouterReconciler(self.ctx)
        # The last metadata.generation seen per (kind, namespace, name): a change of
        # status alone leaves it as it is.
        self._generations: dict[tuple[str, str, str], Any] = {}
        # The servers each router names, by (namespace, router): see `_on_router`.
        self._router_refs: dict[tuple[str, str], set[str]] = {}
        # The members each pool named when last seen, by (namespace, pool): see `_on_pool`.
        self._pool_members: dict[tuple[str, str], set[str]] = {}
        self.ready = ready if ready is not None else asyncio.Event()

    # Watch events to keys

    def _add(self, kind: str, namespace: str, name: str) -> None:
        self.queue.add(Key(kind, namespace, name))
        self.metrics.queue_depth.set(len(self.queue))

    def _status_only(self, kind: str, type_: str, obj: Mapping[str, Any]) -> bool:
        """Whether a watch event changed no more than the object's status (its
        generation, which counts spec changes, is the one seen before)."""
        ns, name = k.key_of(obj)
        key = (kind, ns, name)
        seen = self._generations.get(key)
        if type_ == "DELETED":
            self._generations.pop(key, None)
            return False
        generation = meta(obj).get("generation")
        self._generations[key] = generation
        return type_ == "MODIFIED" and seen is not None and seen == generation

    def _on_server(self, type_: str, obj: dict[str, Any]) -> None:
        ns, name = k.key_of(obj)
        if self._status_only(SERVER, type_, obj):
            # A server's status (ours) shows in its routers' status; the server itself
            # and its pool read only its spec and its pods.
            for router in self.lookups.routers_of(ns, [name]):
                self._add(ROUTER, ns, router)
            return
        self._add(SERVER, ns, name)
        for pool in self.lookups.pools_of(ns, name):
            self._add(POOL, ns, pool)
        for router in self.lookups.routers_of(ns, [name]):
            self._add(ROUTER, ns, router)

    def _on_pool(self, type_: str, obj: dict[str, Any]) -> None:
        ns, name = k.key_of(obj)
        self._add(POOL, ns, name)
        if self._status_only(POOL, type_, obj):
            # A router's request or our own status write: only the pool's swap reads
            # that. Members are scaled by the swap's actions and by `_wake_members`;
            # routers and other pools read the spec. During a swap this keeps the
            # reconciler from re-rendering every member and router on each status write.
            return
        # Membership decides the validity of the pools that share a member with this one,
        # now or before (a member in two pools), and the config of the routers that front
        # them; no other pool reads this one, so no other pool is woken.
        members = set(pool_members(obj))
        before = self._pool_members.pop((ns, name), set())
        if type_ != "DELETED":
            self._pool_members[(ns, name)] = members
        for member in sorted(members | before):
            for other in self.lookups.pools_of(ns, member):
                self._add(POOL, ns, other)
        for member in sorted(members):
            self._add(SERVER, ns, member)
        for router in self.lookups.routers_of(ns, sorted(members | before)):
            self._add(ROUTER, ns, router)

    def _on_router(self, type_: str, obj: dict[str, Any]) -> None:
        ns, name = k.key_of(obj)
        self._add(ROUTER, ns, name)
        if self._status_only(ROUTER, type_, obj):
            return
        # Each backend's NetworkPolicy names the routers that front it: the servers a
        # router names now, and those it named before, render theirs again.
        refs = {
            (b.get("modelServerRef") or {}).get("name")
            for b in (obj.get("spec") or {}).get("backends") or []
        }
        before = self._router_refs.pop((ns, name), set())
        if type_ != "DELETED":
            self._router_refs[(ns, name)] = {r for r in refs if r}
        for server in sorted({r for r in refs if r} | before):
            self._add(SERVER, ns, server)

    def _on_owned(self, _type: str, obj: dict[str, Any]) -> None:
        ns, _ = k.key_of(obj)
        found = labels(obj)
        if found.get(LABEL_SERVER):
            self._add(SERVER, ns, found[LABEL_SERVER])
        if found.get(LABEL_ROUTER):
            self._add(ROUTER, ns, found[LABEL_ROUTER])

    def _on_volume_claim(self, type_: str, obj: dict[str, Any]) -> None:
        """A PersistentVolumeClaim came or went: the servers that save their slots on it
        look again."""
        ns, name = k.key_of(obj)
        for server in self.servers.items(ns):
            kv = (server.get("spec") or {}).get("kvCache") or {}
            own = meta(server).get("name", "") + KV_CLAIM_SUFFIX
            if kv.get("pvc") == name or (kv.get("storageClassName") and own == name):
                self._add(SERVER, ns, str(meta(server).get("name")))

    def _on_deployment(self, type_: str, obj: dict[str, Any]) -> None:
        # A member's ReplicaFailure condition tells its pool why the member has no pod.
        server = labels(obj).get(LABEL_SERVER)
        if server:
            ns, _ = k.key_of(obj)
            for pool in self.lookups.pools_of(ns, server):
                self._add(POOL, ns, pool)
        self._on_owned(type_, obj)

    def _on_claim(self, _type: str, obj: dict[str, Any]) -> None:
        # A claim pool's ResourceClaim allocated (its budget may be the device's memory),
        # or changed by hand (applied back).
        pool = labels(obj).get(LABEL_POOL)
        if pool:
            ns, _ = k.key_of(obj)
            self._add(POOL, ns, pool)

    def _on_devices(self, _type: str, _obj: dict[str, Any]) -> None:
        # A driver's devices or a DeviceClass: what a claim pool says of its device.
        for pool in self.pools.items():
            if ((pool.get("spec") or {}).get("device") or {}).get("claim") is not None:
                ns, name = k.key_of(pool)
                self._add(POOL, ns, name)

    def _on_pod(self, _type: str, obj: dict[str, Any]) -> None:
        ns, _ = k.key_of(obj)
        server = labels(obj).get(LABEL_SERVER)
        if not server:
            return
        # The pool first: a swap waiting for this pod to go (or to be Ready) takes its
        # next step before the server's status is brought up to date.
        for pool in self.lookups.pools_of(ns, server):
            self._add(POOL, ns, pool)
        self._add(SERVER, ns, server)

    # Running

    async def run_informers(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in self.informers:
                tg.create_task(informer.run(), name=f"watch-{informer.resource.plural}")
            await asyncio.gather(*(i.synced.wait() for i in self.informers))
            self.ready.set()
            log.info("caches synced")

    async def run_workers(self) -> None:
        await self.ready.wait()
        try:
            async with asyncio.TaskGroup() as tg:
                for n in range(self.settings.workers):
                    tg.create_task(self._worker(), name=f"worker-{n}")
        finally:
            await self.ctx.background.stop()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            self.metrics.queue_depth.set(len(self.queue))
            started = time.monotonic()
            try:
                result = await self.reconcile(key)
            except k.NamespaceTerminating as e:
                # Its namespace is going away with everything in it: nothing to retry. A
                # change to the object (or its deletion) brings the key back.
                self.queue.forget(key)
                self.metrics.reconcile_total.labels(key.kind, "error").inc()
                log.info("reconcile of %s %s/%s stopped: its namespace is being deleted (%s)",
                         key.kind, key.namespace, key.name, e)
            except (k.KubeError, RenderError, SpecError) as e:
                delay = self.queue.retry(key)
                self.metrics.reconcile_total.labels(key.kind, "error").inc()
                log.warning("reconcile of %s %s/%s failed: %s; again in %.1fs",
                            key.kind, key.namespace, key.name, e, delay)
            except Exception:
                # A bug met on one object: retried with backoff like any failure, logged
                # with its traceback, and counted; the other objects keep being served.
                delay = self.queue.retry(key)
                self.metrics.reconcile_total.labels(key.kind, "error").inc()
                log.exception("reconcile of %s %s/%s raised; again in %.1fs",
                              key.kind, key.namespace, key.name, delay)
            else:
                self.queue.forget(key)
                self.metrics.reconcile_total.labels(key.kind, "success").inc()
                if result.requeue_after is not None:
                    self.queue.add_after(key, result.requeue_after)
            finally:
                self.queue.done(key)
                self.metrics.reconcile_duration_seconds.labels(key.kind).observe(
                    time.monotonic() - started
                )

    async def reconcile(self, key: Key) -> Result:
        """Hand `key` to the reconciler of its kind."""
        if key.kind == SERVER:
            return await self.server_reconciler.reconcile(key)
        if key.kind == POOL:
            return await self.pool_reconciler.reconcile(key)
        if key.kind == ROUTER:
            return await self.router_reconciler.reconcile(key)
        return Result()


__all__ = ["Controller", "Key"]
