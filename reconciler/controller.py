"""The reconciler's shell: watches feed caches and a work queue; workers reconcile one
object at a time: render, apply, prune, run the pool's swap, write status.

Three kinds of keys go through one queue: a ModelServer (its Deployment and Service, at
the replicas its pool wants), a ModelPool (one step of its swap state machine, whose
actions are executed here) and a ModelRouter (its Deployment, ServiceAccount, Role,
RoleBinding, Service and ConfigMap). Every watched change maps to the keys it concerns:
a pod of a member wakes its server and its pool, a hand-edited Deployment wakes its owner,
which applies it back. Nothing is done on a timer except what the swap asks for
(`next_wakeup`) and the retry of a Deployment whose pods cannot be created
(`_retry_creation`), and nothing is written unless it differs from what the API server
holds, so an idle reconciler makes no writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hashlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler import conditions as cond
from reconciler import kube as k
from reconciler import pool_status, scheduling
from reconciler import swap as s
from reconciler.idle import idle_check
from reconciler.logs import ObjectLogger
from reconciler.metrics import ReconcilerMetrics
from reconciler.probes import IdleProbe, Reading
from reconciler.render import (
    LABEL_POOL,
    LABEL_ROUTER,
    LABEL_SERVER,
    MANAGED_BY,
    ROUTER_KINDS,
    SERVER_KINDS,
    SLOT_GATE,
    Renderer,
    RenderError,
    prewarm_pod_name,
    router_object_name,
)
from reconciler.router_config import MissingServer
from reconciler.settings import Settings
from reconciler.spec import (
    DEFAULT_GPU_RESOURCE,
    ModelPoolSpec,
    ModelRouterSpec,
    ModelServerSpec,
    SpecError,
)
from reconciler.timefmt import parse, rfc3339
from reconciler.workqueue import QueueShutDown, WorkQueue

log = logging.getLogger(__name__)

SERVER = "ModelServer"
POOL = "ModelPool"
ROUTER = "ModelRouter"
MANAGED = f"app.kubernetes.io/managed-by={MANAGED_BY}"
MEMBER_NOT_FOUND = "MemberNotFound"
WAITING_FOR_MEMBERS = "WaitingForMembers"
WAITING_FOR_SERVER = "WaitingForModelServer"
APPLY_REFUSED = "ApplyRefused"  # the API server refused a rendered object
# Set on a Deployment whose pods cannot be created, each time the reconciler retries it;
# the Deployment controller copies it to the ReplicaSet, whose controller then tries again.
CREATE_RETRIED = "modelpool.dev/create-retried-at"
# Rendered servers kept (a handful per server: its replicas 0 and 1, in a pool or not).
RENDER_CACHE_SIZE = 1024
APPLIED_MEMO_SIZE = 16384


@dataclass(frozen=True)
class Key:
    kind: str
    namespace: str
    name: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    return any(ref.get("uid") == uid for ref in _meta(obj).get("ownerReferences") or [])


def covers(desired: Any, live: Any) -> bool:
    """Whether `live` already holds every field of `desired` (the server adds defaults,
    so extra fields are fine); scalars compare as text, as quantities do."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            covers(v, live.get(key)) for key, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(covers(d, v) for d, v in zip(desired, live, strict=True))
        )
    if desired is None:
        return live is None
    if isinstance(desired, bool) or isinstance(live, bool):
        return bool(desired == live)
    return str(desired) == str(live)


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


def _pod_active(pod: Mapping[str, Any]) -> bool:
    """A pod that may still hold the GPU: anything not finished, terminating ones too."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    if _meta(pod).get("deletionTimestamp"):
        return False
    conditions: list[Mapping[str, Any]] = (pod.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


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
    ) -> None:
        """`ready` is set once the caches are synced (the health server's /readyz reads
        it, and may be serving before this controller exists)."""
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.renderer = renderer
        self.probe = probe
        self.clock = clock
        self.queue: WorkQueue[Key] = WorkQueue()
        ns = settings.namespace
        self.servers = k.Informer(kube, k.MODEL_SERVERS, ns, self._on_server)
        self.pools = k.Informer(kube, k.MODEL_POOLS, ns, self._on_pool)
        self.routers = k.Informer(kube, k.MODEL_ROUTERS, ns, self._on_router)
        self.deployments = k.Informer(kube, k.DEPLOYMENTS, ns, self._on_deployment, MANAGED)
        self.services = k.Informer(kube, k.SERVICES, ns, self._on_owned, MANAGED)
        self.config_maps = k.Informer(kube, k.CONFIG_MAPS, ns, self._on_owned, MANAGED)
        # A router's identity and RBAC: cached like the rest, so a router reconciled
        # again applies them only when they differ from what runs.
        self.service_accounts = k.Informer(kube, k.SERVICE_ACCOUNTS, ns, self._on_owned,
                                           MANAGED)
        self.roles = k.Informer(kube, k.ROLES, ns, self._on_owned, MANAGED)
        self.role_bindings = k.Informer(kube, k.ROLE_BINDINGS, ns, self._on_owned, MANAGED)
        self.network_policies = k.Informer(kube, k.NETWORK_POLICIES, ns, self._on_owned,
                                           MANAGED)
        self.pods = k.Informer(kube, k.PODS, ns, self._on_pod, LABEL_SERVER)
        self.informers = [
            self.servers, self.pools, self.routers, self.deployments, self.services,
            self.config_maps, self.service_accounts, self.roles, self.role_bindings,
            self.network_policies, self.pods,
        ]
        self._cached: dict[tuple[str, str], k.Informer] = {
            ("apps/v1", "Deployment"): self.deployments,
            ("v1", "Service"): self.services,
            ("v1", "ConfigMap"): self.config_maps,
            ("v1", "ServiceAccount"): self.service_accounts,
            (k.ROLES.api_version, "Role"): self.roles,
            (k.ROLE_BINDINGS.api_version, "RoleBinding"): self.role_bindings,
            (k.NETWORK_POLICIES.api_version, "NetworkPolicy"): self.network_policies,
        }
        self.pool_states: dict[tuple[str, str], s.PoolState] = {}
        self._idle_results: dict[tuple[str, str], list[s.IdleResult | s.ActivityResult]] = (
            defaultdict(list))
        # Idle probes and Events run beside the reconciles: a swap's next step never
        # waits for an Event to be posted.
        self._probes: set[asyncio.Task[None]] = set()
        # The last metadata.generation seen per (kind, namespace, name): a change of
        # status alone leaves it as it is.
        self._generations: dict[tuple[str, str, str], Any] = {}
        self._rendered: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        # A digest of the body last applied per (apiVersion, kind, namespace, name).
        self._applied: dict[tuple[str, str, str, str], bytes] = {}
        self._router_refs: dict[tuple[str, str], set[str]] = {}
        # The swap target each pool's prewarm pod reads for, and whether one was created.
        self._prewarming: dict[tuple[str, str], tuple[str, bool]] = {}
        # (generation, when first seen) per pool and router: see `_settling`
        self._first_seen: dict[Key, tuple[int, float]] = {}
        # When each Deployment whose pods cannot be created was last retried (or first
        # seen failing), by (namespace, name): see `_retry_creation`.
        self._create_retried: dict[tuple[str, str], float] = {}
        self.ready = ready if ready is not None else asyncio.Event()

    # Watch events to keys

    def _add(self, kind: str, namespace: str, name: str) -> None:
        self.queue.add(Key(kind, namespace, name))
        self.metrics.queue_depth.set(len(self.queue))

    def _pools_of(self, namespace: str, server: str) -> list[str]:
        return [
            _meta(p)["name"]
            for p in self.pools.items(namespace)
            if any(m.get("name") == server for m in (p.get("spec") or {}).get("members") or [])
        ]

    def _routers_of(self, namespace: str, servers: Sequence[str]) -> list[str]:
        found = []
        for r in self.routers.items(namespace):
            refs = {
                (b.get("modelServerRef") or {}).get("name")
                for b in (r.get("spec") or {}).get("backends") or []
            }
            if refs & set(servers):
                found.append(_meta(r)["name"])
        return found

    def _status_only(self, kind: str, type_: str, obj: Mapping[str, Any]) -> bool:
        """Whether a watch event changed no more than the object's status (its
        generation, which counts spec changes, is the one seen before)."""
        ns, name = k.key_of(obj)
        key = (kind, ns, name)
        seen = self._generations.get(key)
        if type_ == "DELETED":
            self._generations.pop(key, None)
            return False
        generation = _meta(obj).get("generation")
        self._generations[key] = generation
        return type_ == "MODIFIED" and seen is not None and seen == generation

    def _on_server(self, type_: str, obj: dict[str, Any]) -> None:
        ns, name = k.key_of(obj)
        if self._status_only(SERVER, type_, obj):
            # A server's status (ours) shows in its routers' status; the server itself
            # and its pool read only its spec and its pods.
            for router in self._routers_of(ns, [name]):
                self._add(ROUTER, ns, router)
            return
        self._add(SERVER, ns, name)
        for pool in self._pools_of(ns, name):
            self._add(POOL, ns, pool)
        for router in self._routers_of(ns, [name]):
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
        # membership decides other pools' validity (a member in two pools) and routers' config
        for other in self.pools.items(ns):
            self._add(POOL, ns, _meta(other)["name"])
        members = [m.get("name") for m in (obj.get("spec") or {}).get("members") or []]
        for member in members:
            if member:
                self._add(SERVER, ns, member)
        for router in self._routers_of(ns, [m for m in members if m]):
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
        labels = _labels(obj)
        if labels.get(LABEL_SERVER):
            self._add(SERVER, ns, labels[LABEL_SERVER])
        if labels.get(LABEL_ROUTER):
            self._add(ROUTER, ns, labels[LABEL_ROUTER])

    def _on_deployment(self, type_: str, obj: dict[str, Any]) -> None:
        # A member's ReplicaFailure condition tells its pool why the member has no pod.
        server = _labels(obj).get(LABEL_SERVER)
        if server:
            ns, _ = k.key_of(obj)
            for pool in self._pools_of(ns, server):
                self._add(POOL, ns, pool)
        self._on_owned(type_, obj)

    def _on_pod(self, _type: str, obj: dict[str, Any]) -> None:
        ns, _ = k.key_of(obj)
        server = _labels(obj).get(LABEL_SERVER)
        if not server:
            return
        # The pool first: a swap waiting for this pod to go (or to be Ready) takes its
        # next step before the server's status is brought up to date.
        for pool in self._pools_of(ns, server):
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
            for task in self._probes:
                task.cancel()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            self.metrics.queue_depth.set(len(self.queue))
            started = time.monotonic()
            try:
                await self.reconcile(key)
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
            finally:
                self.queue.done(key)
                self.metrics.reconcile_duration_seconds.labels(key.kind).observe(
                    time.monotonic() - started
                )

    async def reconcile(self, key: Key) -> None:
        if key.kind == SERVER:
            await self.reconcile_server(key.namespace, key.name)
        elif key.kind == POOL:
            await self.reconcile_pool(key.namespace, key.name)
        elif key.kind == ROUTER:
            await self.reconcile_router(key.namespace, key.name)

    # Writes (counted, and put back into the caches at once)

    async def _apply(self, body: dict[str, Any]) -> None:
        """Server-side apply `body`, unless the object already holds it. Holding every
        field of `body` is not enough: a field the templates rendered before and no longer
        do (a volume, a gate) is still there, and only an apply removes it. So the object
        is skipped only when it covers a body that is also the one this process applied
        last (after a restart, each object is applied once more, a no-op)."""
        api_version, kind = str(body.get("apiVersion")), str(body.get("kind"))
        ns, name = k.key_of(body)
        key = (api_version, kind, ns, name)
        digest = hashlib.blake2b(json.dumps(body, sort_keys=True).encode(),
                                 digest_size=16).digest()
        cache = self._cached.get((api_version, kind))
        if cache is not None and self._applied.get(key) == digest:
            live = cache.get(ns, name)
            if live is not None and covers(body, live):
                return
        result = await self.kube.apply(body)
        self.metrics.api_writes_total.labels("apply", kind).inc()
        if cache is not None:
            cache.update(result)
        if len(self._applied) >= APPLIED_MEMO_SIZE:
            self._applied.clear()  # each object is applied once more, a no-op
        self._applied[key] = digest

    async def _apply_for(self, body: Mapping[str, Any], logger: ObjectLogger,
                         objects: Sequence[dict[str, Any]]) -> None:
        """Apply what `body` (a ModelServer or a ModelRouter) renders. A refusal that
        trying again will not change by itself (an admission policy, a webhook, a quota:
        400, 403, 422) stalls `body`, naming the object and the API server's words, before
        it is raised again to be retried with backoff, so `kubectl describe` says what
        the log says. A namespace being deleted refuses with 403 too: that is no stall,
        the object goes with its namespace (`k.NamespaceTerminating`)."""
        for obj in objects:
            try:
                await self._apply(obj)
            except k.KubeError as e:
                if e.status in (400, 403, 422) and not isinstance(e, k.NamespaceTerminating):
                    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
                    await self._server_stalled(body, logger, APPLY_REFUSED,
                                               f"{kind} {name} was refused: {e}")
                raise

    async def _patch_status(
        self, informer: k.Informer, obj: Mapping[str, Any], patch: Mapping[str, Any]
    ) -> None:
        if not patch:
            return
        ns, name = k.key_of(obj)
        result = await self.kube.merge_patch_status(informer.resource, ns, name, patch)
        self.metrics.api_writes_total.labels("patch-status", informer.resource.kind).inc()
        informer.update(result)

    async def _post_event(self, body: Mapping[str, Any], type_: str, reason: str,
                          message: str) -> None:
        await self.kube.post_event(body, type_=type_, reason=reason, message=message,
                                   now=self.clock(), instance=self.settings.leader.identity)
        self.metrics.api_writes_total.labels("create", "Event").inc()

    def _logger(self, body: Mapping[str, Any]) -> ObjectLogger:
        # A Warning posted before a stall is written is refused in a namespace being
        # deleted: that ends the reconcile there, so nothing going away is called Stalled.
        return ObjectLogger(log, body, self._post_event, final=(k.NamespaceTerminating,))

    async def _prune(
        self,
        kinds: Sequence[tuple[str, str]],
        namespace: str,
        selector: tuple[str, str],
        owner_uid: str | None,
        keep: set[tuple[str, str]],
    ) -> None:
        """Delete what this owner rendered before and renders no more."""
        label, value = selector
        for api_version, kind in kinds:
            cache = self._cached.get((api_version, kind))
            resource = k.BY_KIND[(api_version, kind)]
            if cache is not None:
                candidates = [o for o in cache.items(namespace) if _labels(o).get(label) == value]
            else:
                candidates, _ = await self.kube.list_all(
                    resource, namespace, f"{label}={value},{MANAGED}"
                )
            for obj in candidates:
                name = str(_meta(obj).get("name"))
                if (kind, name) in keep or not _owned_by(obj, owner_uid):
                    continue
                log.info("pruning %s %s/%s", kind, namespace, name)
                await self.kube.delete(resource, namespace, name, _meta(obj).get("uid"))
                self._applied.pop((api_version, kind, namespace, name), None)
                self.metrics.api_writes_total.labels("delete", kind).inc()

    # ModelServer

    def _pool_for(self, namespace: str, server: str) -> tuple[str | None, bool]:
        """(the pool holding `server`, whether membership is ambiguous)."""
        pools = sorted(self._pools_of(namespace, server))
        if len(pools) > 1:
            return None, True
        return (pools[0] if pools else None), False

    def _server_replicas(
        self, spec: ModelServerSpec, pool: str | None, ambiguous: bool, created: float | None
    ) -> int:
        """A pool member's replicas are what its pool's swap wants; while that cannot be
        known (a member of two pools, a pool with a problem, not yet stepped) whatever runs
        keeps running: nothing is scaled. A server in no pool runs at spec.replicas, but
        not in its first seconds: a pool applied together with it (kubectl apply -k, a
        GitOps sync) may reach the reconciler a moment later and must claim it before it
        loads, or two members would start at once."""
        live = self.deployments.get(spec.namespace, spec.name)
        live_replicas = int(((live or {}).get("spec") or {}).get("replicas") or 0)
        if pool is None and not ambiguous:
            settle = self.settings.swap.standalone_settle_seconds
            age = self.clock() - created if created is not None else settle
            if age < settle:
                self.queue.add_after(Key(SERVER, spec.namespace, spec.name), settle - age)
                return min(spec.replicas, live_replicas)
            return spec.replicas
        state = self.pool_states.get((spec.namespace, pool)) if pool else None
        wanted = s.desired_replicas(state) if state is not None else None
        if wanted is not None and spec.name in wanted:
            return wanted[spec.name]
        return live_replicas

    def _render_server(self, spec: ModelServerSpec, replicas: int, owner_uid: str | None,
                       pool: str | None) -> list[dict[str, Any]]:
        """A server's objects, rendered once per (spec generation, replicas, pool): every
        pod event reconciles its server, and a swap's scale-up should not wait for the
        templates to be rendered again to the same output."""
        routers = tuple(sorted(self._routers_of(spec.namespace, [spec.name])))
        key = (spec.namespace, spec.name, spec.uid, spec.generation, replicas, owner_uid, pool,
               routers)
        objects = self._rendered.get(key)
        if objects is None:
            objects = self.renderer.model_server(
                spec, replicas=replicas, owner_uid=owner_uid, pool=pool, routers=routers)
            if len(self._rendered) >= RENDER_CACHE_SIZE:
                self._rendered.clear()
            self._rendered[key] = objects
        return copy.deepcopy(objects)

    async def reconcile_server(self, namespace: str, name: str) -> None:
        body = self.servers.get(namespace, name)
        if body is None:
            self._create_retried.pop((namespace, name), None)
            return  # garbage collection removes what it owned
        logger = self._logger(body)
        meta = _meta(body)
        status = body.get("status") or {}
        try:
            spec = ModelServerSpec.from_body(body)
        except SpecError as e:
            await self._server_stalled(body, logger, "InvalidSpec", str(e))
            return
        pool, ambiguous = self._pool_for(namespace, name)
        replicas = self._server_replicas(
            spec, pool, ambiguous, parse(meta.get("creationTimestamp"))
        )
        objects = self._render_server(spec, replicas, meta.get("uid"), pool)
        await self._apply_for(body, logger, objects)
        await self._prune(SERVER_KINDS, namespace, (LABEL_SERVER, name), meta.get("uid"),
                          {(str(o["kind"]), str(o["metadata"]["name"])) for o in objects})
        pods = [p for p in self.pods.items(namespace) if _labels(p).get(LABEL_SERVER) == name]
        active = [p for p in pods if _pod_active(p)]
        ready = sum(1 for p in active if _pod_ready(p))
        failed = any((p.get("status") or {}).get("phase") == "Failed" for p in pods)
        if ready > 0:
            phase = "Ready"
        elif replicas == 0 and not active:
            phase = "Stopped"
        elif failed and not active:
            phase = "Failed"
        elif any((p.get("spec") or {}).get("nodeName") for p in active):
            phase = "Loading"
        else:
            phase = "Pending"
        stalled = ("MemberOfTwoPools", f"{name} is a member of more than one pool") \
            if ambiguous else None
        failure = None
        if phase in ("Ready", "Stopped"):
            why = "a pod is Ready" if phase == "Ready" else "stopped by its pool"
            ready_c = (True, phase, why)
            reconciling = None
        else:
            ready_c = (False, phase, f"{ready}/{replicas} pods Ready")
            reconciling = (phase, f"{ready}/{replicas} pods Ready")
            failure = None if active else scheduling.creation_failure(
                self.deployments.get(namespace, name) or {})
            if failure is not None:  # no pod to show why: its Deployment says
                ready_c = (False, scheduling.FAILED_CREATE, f"{name} cannot be created: {failure}")
                reconciling = (scheduling.FAILED_CREATE, ready_c[2])
            stuck = next((f for f in map(scheduling.container_failure, active) if f), None)
            if stuck is not None:  # the kubelet cannot run a container
                reconciling = (stuck[0], f"{name} is not starting: {stuck[1]}")
                ready_c = (False, *reconciling)
        if stalled is not None:
            await self._warn_once(body, logger, stalled)
        owned = {
            "phase": phase,
            "replicas": replicas,
            "readyReplicas": ready,
            "endpoint": f"http://{name}.{namespace}.svc:{spec.port}",
            "pool": pool,
            "networkPolicy": None if spec.allow_direct_access else name,
            "observedGeneration": spec.generation,
            "conditions": cond.merge(
                status.get("conditions"),
                cond.kstatus(ready=ready_c, reconciling=reconciling, stalled=stalled),
                now=rfc3339(self.clock()),
                observed_generation=spec.generation,
            ),
        }
        await self._patch_status(self.servers, body, pool_status.status_patch(owned, status))
        await self._retry_creation(Key(SERVER, namespace, name), namespace, name,
                                   failure is not None, logger)

    async def _retry_creation(self, key: Key, namespace: str, deployment: str,
                              failing: bool, logger: ObjectLogger) -> None:
        """While the pods of `deployment` cannot be created (`failing`: its ReplicaFailure
        condition, no pod), have its ReplicaSet try again every `create_retry_seconds`,
        and look at `key` again then. The ReplicaSet controller's own retries back off to
        minutes (`scheduling.creation_retry`); an annotation on the Deployment, which the
        Deployment controller copies to the ReplicaSet, puts the ReplicaSet back in its
        controller's queue at once. So a pool recovers within that period of the cause
        going (a namespace's Pod Security level lowered, a quota raised)."""
        name = (namespace, deployment)
        if not failing:
            self._create_retried.pop(name, None)
            return
        now = self.clock()
        last = self._create_retried.setdefault(name, now)  # its controller just tried
        due, wait = scheduling.creation_retry(last, now, self.settings.create_retry_seconds)
        if due:
            self._create_retried[name] = now
            patch = {"metadata": {"annotations": {CREATE_RETRIED: rfc3339(now)}}}
            try:
                await self.kube.strategic_merge_patch(k.DEPLOYMENTS, namespace, deployment,
                                                      patch)
            except k.NamespaceTerminating:
                raise
            except k.KubeError as e:  # tried again at the next period
                logger.warning("pods of Deployment %s not retried: %s", deployment, e)
            else:
                self.metrics.api_writes_total.labels("patch", "Deployment").inc()
                logger.info("pods of Deployment %s cannot be created: retrying", deployment)
        self.queue.add_after(key, wait)

    async def _warn_once(self, body: Mapping[str, Any], logger: ObjectLogger,
                         stalled: tuple[str, str]) -> None:
        """An Event for a Stalled reason the object's status does not show yet."""
        before = cond.find((body.get("status") or {}).get("conditions"), cond.STALLED)
        if before is None or before.get("status") != "True" or before.get("reason") != stalled[0]:
            await logger.event("Warning", *stalled)

    async def _server_stalled(self, body: Mapping[str, Any], logger: ObjectLogger,
                              reason: str, message: str) -> None:
        await self._warn_once(body, logger, (reason, message))
        status = body.get("status") or {}
        generation = int(_meta(body).get("generation") or 0)
        owned = {
            "observedGeneration": generation,
            "conditions": cond.merge(
                status.get("conditions"),
                cond.kstatus(ready=(False, reason, message), stalled=(reason, message)),
                now=rfc3339(self.clock()),
                observed_generation=generation,
            ),
        }
        informer = self.servers if body.get("kind") == SERVER else self.routers
        await self._patch_status(informer, body, pool_status.status_patch(owned, status))

    async def _router_waiting(self, body: Mapping[str, Any], message: str) -> None:
        """A router just applied or changed whose ModelServer is not seen yet: Reconciling,
        not Stalled (`_settling`)."""
        status = body.get("status") or {}
        generation = int(_meta(body).get("generation") or 0)
        waiting = (WAITING_FOR_SERVER, message.replace("which does not exist", "not seen yet"))
        owned = {
            "observedGeneration": generation,
            "conditions": cond.merge(
                status.get("conditions"),
                cond.kstatus(ready=(False, *waiting), reconciling=waiting),
                now=rfc3339(self.clock()),
                observed_generation=generation,
            ),
        }
        await self._patch_status(self.routers, body, pool_status.status_patch(owned, status))

    # ModelPool

    def _pool_problem(self, spec: ModelPoolSpec) -> s.Problem | None:
        missing = [m for m in spec.member_names if self.servers.get(spec.namespace, m) is None]
        if missing:
            return s.Problem(MEMBER_NOT_FOUND, "ModelServer not found: " + ", ".join(missing))
        shared = []
        for m in spec.member_names:
            others = [p for p in self._pools_of(spec.namespace, m) if p != spec.name]
            if others:
                shared.append(f"{m} (also in {', '.join(sorted(others))})")
        if shared:
            return s.Problem("MemberInTwoPools", "members of another pool: " + ", ".join(shared))
        invalid = []
        for m in spec.member_names:
            try:
                ModelServerSpec.from_body(self.servers.get(spec.namespace, m) or {})
            except SpecError as e:
                invalid.append(f"{m}: {e}")
        if invalid:
            return s.Problem("InvalidMember", "; ".join(invalid))
        return None

    def _settling(self, kind: str, body: Mapping[str, Any]) -> bool:
        """Whether a ModelServer that `body` names but the reconciler has not seen may still
        be on its way: in progress, not stalled. Objects applied together (as `kubectl
        apply -k` and GitOps tools do) reach the reconciler in any order, on creation and
        on every change of spec alike (a commit that adds a member to a pool and the member
        itself). So for `standalone_settle_seconds` from the first time this generation of
        the spec is seen, while its status is not yet Stalled for it, the object waits
        and is looked at again when the server appears or the time is up. A restarted
        reconciler keeps a Stalled status Stalled: its spec was judged before."""
        meta = _meta(body)
        key = Key(kind, str(meta.get("namespace")), str(meta.get("name")))
        generation = int(meta.get("generation") or 0)
        status = body.get("status") or {}
        reconciling = cond.find(status.get("conditions"), cond.RECONCILING) or {}
        judged = status.get("observedGeneration") == generation and not (
            reconciling.get("status") == "True"
            and reconciling.get("reason") in (WAITING_FOR_MEMBERS, WAITING_FOR_SERVER))
        now = self.clock()
        seen = self._first_seen.get(key)
        if seen is None or seen[0] != generation:
            seen = self._first_seen[key] = (generation, now)
        remaining = self.settings.swap.standalone_settle_seconds - (now - seen[1])
        if judged or remaining <= 0:
            return False
        self.queue.add_after(key, remaining)
        return True

    def _maybe_pending(self, body: Mapping[str, Any], problem: s.Problem) -> s.Problem:
        """Missing members of a pool just applied or changed: waited for (`_settling`)."""
        if not self._settling(POOL, body):
            return problem
        message = problem.message.replace("ModelServer not found", "waiting for ModelServer")
        return s.Problem(WAITING_FOR_MEMBERS, message, pending=True)

    def _member_pods(self, namespace: str, members: Sequence[str]) -> s.MemberPods:
        pods: dict[str, int] = {}
        scheduled: dict[str, int] = {}
        ready: dict[str, int] = {}
        unschedulable: dict[str, str] = {}
        terminating: dict[str, int] = {}
        failing: dict[str, tuple[str, str]] = {}
        for pod in self.pods.items(namespace):
            member = _labels(pod).get(LABEL_SERVER) or ""
            if member not in members or not _pod_active(pod):
                continue
            pods[member] = pods.get(member, 0) + 1
            if _meta(pod).get("deletionTimestamp"):
                terminating[member] = terminating.get(member, 0) + 1
            if (pod.get("spec") or {}).get("nodeName"):
                scheduled[member] = scheduled.get(member, 0) + 1
            if _pod_ready(pod):
                ready[member] = ready.get(member, 0) + 1
            refused = scheduling.refusal(pod)
            if refused is not None and member not in unschedulable:
                unschedulable[member] = self._unschedulable(namespace, member, refused)
            stuck = scheduling.container_failure(pod)
            if stuck is not None and member not in failing:
                failing[member] = (stuck[0], f"{member} is not starting: {stuck[1]}")
        not_created: dict[str, str] = {}
        for member in members:
            failure = scheduling.creation_failure(self.deployments.get(namespace, member) or {})
            if failure is not None and not pods.get(member):
                not_created[member] = f"{member} cannot be created: {failure}"
        return s.MemberPods(pods=pods, scheduled=scheduled, ready=ready,
                            unschedulable=unschedulable, terminating=terminating,
                            not_created=not_created,
                            failing={m: f for m, f in failing.items() if not ready.get(m)})

    def _unschedulable(self, namespace: str, member: str, message: str) -> str:
        """The scheduler's refusal, naming the pods in view that hold the GPU it lacks."""
        try:
            resource = ModelServerSpec.from_body(
                self.servers.get(namespace, member) or {}).resources.gpu_resource
        except SpecError:
            resource = DEFAULT_GPU_RESOURCE
        return scheduling.explain(member, message, resource,
                                  scheduling.holders(self.pods.items(), resource))

    async def reconcile_pool(self, namespace: str, name: str) -> None:
        body = self.pools.get(namespace, name)
        key = (namespace, name)
        if body is None:
            self._first_seen.pop(Key(POOL, namespace, name), None)
            self._prewarming.pop(key, None)  # the garbage collector takes its pod
            gone = self.pool_states.pop(key, None)
            if gone is not None:
                self.metrics.forget_pool(namespace, name, gone.config.members)
            return
        status = body.get("status") or {}
        generation = int(_meta(body).get("generation") or 0)
        prewarm = False
        try:
            spec = ModelPoolSpec.from_body(body)
            prewarm = spec.prewarm
        except SpecError as e:
            config = s.PoolConfig(members=())
            problem: s.Problem | None = s.Problem("InvalidSpec", str(e))
        else:
            config = s.PoolConfig(
                members=spec.member_names,
                default=spec.default,
                policy=spec.swap_policy,
                swap_budget=spec.swap_budget_seconds,
                min_residency=spec.min_residency_seconds,
                probe_interval=self.settings.swap.probe_interval_seconds,
                reclaim_after=spec.reclaim_after_seconds,
                priorities={m.name: m.priority for m in spec.members},
                idle_unload_after=spec.idle_unload_after_seconds,
            )
            problem = self._pool_problem(spec)
            if problem is not None and problem.reason == MEMBER_NOT_FOUND:
                problem = self._maybe_pending(body, problem)
        now = self.clock()
        previous = self.pool_states.get(key)
        state = previous
        if state is None:
            state = pool_status.restore(config, generation, status)
        events: list[s.Event] = [
            s.SpecObserved(config, generation, problem),
            s.RequestObserved(pool_status.request_of(status)),
            s.MembersObserved(self._member_pods(namespace, config.members)),
            *self._idle_results.pop(key, []),
            s.Tick(),
        ]
        actions: list[s.Action] = []
        for event in events:
            state, more = s.step(state, event, now)
            actions += more
        self.pool_states[key] = state
        logger = self._logger(body)
        self.metrics.pool_seen(namespace, name, config.members)
        # Metrics first: whoever sees the new status must find them already counted.
        recorded = (s.RecordSwap, s.RecordFailure, s.RecordDeferral, s.RecordIdleUnload)
        for action in actions:
            if isinstance(action, recorded):
                await self._execute(namespace, name, body, action, logger)
        self.metrics.set_resident(namespace, name, config.members, state.resident)
        # Then what the swap waits on, at once: an idle probe, a scale. The swap's order
        # lives in the state machine (a target is scaled up only in the step that saw
        # the incumbent's pods gone), so the status write need not come first; should
        # the reconciler die between the two, the status it restores from is one step
        # behind and the swap resumes from there (at worst draining the incumbent again).
        first = (s.ProbeIdle, s.ProbeActivity, s.Scale)
        for action in actions:
            if isinstance(action, first):
                await self._execute(namespace, name, body, action, logger)
        await self._release(namespace, s.released(state), logger)
        self._wake_members(namespace, previous, state, actions)
        # Then status, then cleared requests (after lastSwap, which is how routers learn
        # of an abandoned swap) and Events.
        owned = pool_status.pool_status(state, status, now)
        await self._patch_status(self.pools, body, pool_status.status_patch(owned, status))
        for action in actions:
            if not isinstance(action, (*recorded, *first)):
                await self._execute(namespace, name, body, action, logger)
        await self._prewarm(namespace, name, body, state if prewarm else None, logger)
        wake = s.next_wakeup(state)
        if wake is not None:
            self.queue.add_after(Key(POOL, namespace, name), max(0.0, wake - self.clock()))

    async def _prewarm(self, namespace: str, pool: str, body: Mapping[str, Any],
                       state: s.PoolState | None, logger: ObjectLogger) -> None:
        """While a swap drains and unloads its incumbent, a pod on the incumbent's node
        reads the target's weights into the page cache (spec.prewarm; `state` None when
        it is off). It is created in the step that starts the drain and deleted once the
        swap ends: not as the target loads, when a read still under way goes on
        feeding the load, and the kubelet's work is the target's start."""
        key = (namespace, pool)
        swap = s.visible_swap(state) if state is not None else None
        want = None
        if swap is not None and swap.from_ is not None:
            want = swap.to
        have = self._prewarming.get(key)
        if have is not None and have[0] != want:
            del self._prewarming[key]
            if have[1]:
                try:
                    await self.kube.delete(k.PODS, namespace, prewarm_pod_name(pool))
                    self.metrics.api_writes_total.labels("delete", "Pod").inc()
                except k.KubeError as e:  # its activeDeadlineSeconds ends it anyway
                    logger.warning("prewarm pod not deleted: %s", e)
        if want is None or (have is not None and have[0] == want):
            return
        assert state is not None and swap is not None and swap.from_ is not None
        swap_budget = state.config.swap_budget
        nodes = sorted({str((p.get("spec") or {}).get("nodeName"))
                        for p in self.pods.items(namespace)
                        if _labels(p).get(LABEL_SERVER) == swap.from_ and _pod_active(p)
                        and (p.get("spec") or {}).get("nodeName")})
        if not nodes:
            return  # the incumbent is gone already: the load is about to start
        try:
            target = ModelServerSpec.from_body(self.servers.get(namespace, want) or {})
        except SpecError:
            return  # the swap itself reports a target it cannot use
        pod = self.renderer.prewarm_pod(target, pool=pool, pool_uid=_meta(body).get("uid"),
                                        node=nodes[0], deadline=swap_budget)
        # Recorded before the apply: a refused one still has the name deleted once the
        # swap ends, so a pod left from an earlier swap, whose spec a pod cannot change
        # (422), is out of the way of the next swap's reader.
        self._prewarming[key] = (want, pod is not None)
        if pod is None:
            return
        try:
            await self.kube.apply(pod)
        except k.KubeError as e:
            # best effort: the swap goes on without it (admission may refuse the pod)
            logger.warning("prewarm pod for %s not created: %s", want, e)
            return
        self.metrics.api_writes_total.labels("apply", "Pod").inc()
        logger.info("prewarming %s on %s while %s unloads", want, nodes[0], swap.from_)
        self._background(functools.partial(
            logger.event, "Normal", "Prewarming",
            f"reading {want}'s weights into the page cache of {nodes[0]} while "
            f"{swap.from_} drains and unloads"), "event-Prewarming")

    async def _release(self, namespace: str, members: frozenset[str],
                       logger: ObjectLogger) -> None:
        """Lift the slot gate of the pods of `members` (the one member that may hold the
        pool's slot now, if any): the scheduler places them from then on. Level-based, so a
        pod the ReplicaSet creates later (a staged target, a resident's pod replaced) is
        released by the pool's next reconcile, which its creation triggers."""
        for pod in self.pods.items(namespace):
            member = _labels(pod).get(LABEL_SERVER) or ""
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            if (member not in members or not _pod_active(pod)
                    or _meta(pod).get("deletionTimestamp")
                    or not any(g.get("name") == SLOT_GATE for g in gates)):
                continue
            name = str(_meta(pod).get("name"))
            try:
                await self.kube.strategic_merge_patch(k.PODS, namespace, name, {
                    "spec": {"schedulingGates": [{"$patch": "delete", "name": SLOT_GATE}]}})
            except k.NotFound:
                continue  # gone already: its ReplicaSet makes another, released in turn
            self.metrics.api_writes_total.labels("patch", "Pod").inc()
            logger.info("released %s's pod %s to the scheduler", member, name)

    def _wake_members(self, namespace: str, previous: s.PoolState | None,
                      state: s.PoolState, actions: Sequence[s.Action]) -> None:
        """Reconcile the members whose wanted replicas changed in this step without a
        Scale action of their own (a pool first seen, a problem fixed): a status write
        of the pool no longer wakes every member."""
        after = s.desired_replicas(state)
        if after is None:
            return
        before = s.desired_replicas(previous) if previous is not None else None
        scaled = {a.member for a in actions if isinstance(a, s.Scale)}
        for member, replicas in after.items():
            if member not in scaled and (before is None or before.get(member) != replicas):
                self._add(SERVER, namespace, member)

    def _background(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        task = asyncio.get_running_loop().create_task(_quietly(work), name=name)
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _execute(self, namespace: str, pool: str, body: Mapping[str, Any],
                       action: s.Action, logger: ObjectLogger) -> None:
        m = self.metrics
        if isinstance(action, s.Scale):
            logger.info("scaling %s to %d", action.member, action.replicas)
            try:
                await self.reconcile_server(namespace, action.member)
            except Exception:
                # The swap has moved on and will not ask again: the member's own key
                # retries the scale (it reads the replicas the pool now wants).
                self.queue.retry(Key(SERVER, namespace, action.member))
                raise
        elif isinstance(action, s.ProbeIdle):
            self._start_probe(namespace, pool, action.member)
        elif isinstance(action, s.ProbeActivity):
            self._start_probe(namespace, pool, action.member, activity=True)
        elif isinstance(action, s.ClearRequest):
            await self._clear_request(namespace, pool, action.generation, logger)
        elif isinstance(action, s.EmitEvent):
            # posted beside the reconcile: the swap's next step does not wait for it
            self._background(
                functools.partial(logger.event, action.type, action.reason, action.message),
                f"event-{action.reason}")
        elif isinstance(action, s.RecordSwap):
            m.swap_done(namespace, pool, action.from_, action.to, action.duration, action.phases)
        elif isinstance(action, s.RecordFailure):
            m.swap_failures_total.labels(namespace, pool, action.member, action.reason).inc()
        elif isinstance(action, s.RecordDeferral):
            m.swap_deferrals_total.labels(namespace, pool, action.reason).inc()
        elif isinstance(action, s.RecordIdleUnload):
            m.idle_unloads_total.labels(namespace, pool, action.member).inc()

    async def _clear_request(self, namespace: str, pool: str, generation: int,
                             logger: ObjectLogger) -> None:
        cleared = {
            "member": None,
            "requestedAt": rfc3339(self.clock()),
            "requestedBy": f"{namespace}/{MANAGED_BY}/{self.settings.leader.identity}",
        }
        try:
            result = await self.kube.json_patch_status(
                k.MODEL_POOLS, namespace, pool, k.clear_request_ops(generation, cleared)
            )
        except k.Conflict:
            logger.info("request %d was replaced before it could be cleared", generation)
            self._add(POOL, namespace, pool)
            return
        self.metrics.api_writes_total.labels("json-patch-status", POOL).inc()
        self.pools.update(result)

    def _start_probe(self, namespace: str, pool: str, member: str,
                     activity: bool = False) -> None:
        """An idle probe of a swap's incumbent or, with `activity`, of a resident under
        idleUnloadAfter: run beside the reconcile, its answer fed to the next step."""
        def result(reading: Reading) -> s.IdleResult | s.ActivityResult:
            if activity:
                return s.ActivityResult(member, reading.verdict, reading.mark, reading.detail)
            return s.IdleResult(member, reading.verdict, reading.detail)

        body = self.servers.get(namespace, member)
        try:
            spec = ModelServerSpec.from_body(body or {})
        except SpecError as e:
            self._idle_results[(namespace, pool)].append(
                result(Reading(s.Verdict.FAILED, str(e))))
            self._add(POOL, namespace, pool)
            return
        check = idle_check(spec.runtime, spec.idle)
        addresses = [
            (str(p["status"]["podIP"]), spec.port)
            for p in self.pods.items(namespace)
            if _labels(p).get(LABEL_SERVER) == member
            and _pod_active(p)
            and (p.get("status") or {}).get("podIP")
        ]

        async def run() -> None:
            try:
                if activity:
                    reading = await self.probe.activity(check, addresses)
                else:
                    reading = Reading(*await self.probe.probe(check, addresses))
            except Exception as e:  # fail closed, whatever went wrong
                log.warning("idle probe of %s/%s raised: %s", namespace, member, e)
                reading = Reading(s.Verdict.FAILED, type(e).__name__)
            self._idle_results[(namespace, pool)].append(result(reading))
            self._add(POOL, namespace, pool)

        task = asyncio.get_running_loop().create_task(run(), name=f"probe-{member}")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    # ModelRouter

    async def reconcile_router(self, namespace: str, name: str) -> None:
        body = self.routers.get(namespace, name)
        if body is None:
            self._first_seen.pop(Key(ROUTER, namespace, name), None)
            self._create_retried.pop((namespace, router_object_name(name)), None)
            return
        meta = _meta(body)
        if meta.get("deletionTimestamp"):
            # Being deleted (a finalizer holds it): what it rendered goes with it, and the
            # servers it refers to may be gone first (its namespace is being deleted, or
            # git removed them together), which is no reason to call it Stalled.
            log.info("ModelRouter %s/%s is being deleted: what it rendered goes with it",
                     namespace, name)
            return
        logger = self._logger(body)
        status = body.get("status") or {}
        try:
            spec = ModelRouterSpec.from_body(body)
            servers = {}
            for obj in self.servers.items(namespace):
                with contextlib.suppress(SpecError):
                    server = ModelServerSpec.from_body(obj)
                    servers[server.name] = server
            pools = []
            for obj in self.pools.items(namespace):
                with contextlib.suppress(SpecError):
                    pools.append(ModelPoolSpec.from_body(obj))
            objects = self.renderer.router(spec, servers=servers, pools=pools,
                                           owner_uid=meta.get("uid"))
        except MissingServer as e:
            if self._settling(ROUTER, body):
                await self._router_waiting(body, str(e))
            else:
                await self._server_stalled(body, logger, "CannotRender", str(e))
            return
        except (SpecError, RenderError) as e:
            reason = "InvalidSpec" if isinstance(e, SpecError) else "CannotRender"
            await self._server_stalled(body, logger, reason, str(e))
            return
        await self._apply_for(body, logger, objects)
        await self._prune(ROUTER_KINDS, namespace, (LABEL_ROUTER, name), meta.get("uid"),
                          {(str(o["kind"]), str(o["metadata"]["name"])) for o in objects})
        deployment = self.deployments.get(namespace, router_object_name(name)) or {}
        ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
        wanted = spec.proxy.replicas
        phase = "Ready" if ready >= wanted else "Pending"
        backends = []
        for b in spec.backends:
            pool = None
            if b.model_server_ref:
                pools_of = self._pools_of(namespace, b.model_server_ref)
                pool = pools_of[0] if len(pools_of) == 1 else None
            server_status = (self.servers.get(namespace, b.model_server_ref or "") or {}).get(
                "status") or {}
            backends.append({
                "name": b.name,
                "modelServer": b.model_server_ref,
                "pool": pool,
                "url": b.url,
                "phase": server_status.get("phase") if b.model_server_ref else "External",
                "ready": bool(b.url) or server_status.get("phase") == "Ready",
            })
        failure = None
        if phase == "Ready":
            ready_c = (True, "Ready", f"{ready}/{wanted} router pods Ready")
            reconciling = None
        else:
            ready_c = (False, "Pending", f"{ready}/{wanted} router pods Ready")
            reconciling = ("Pending", f"{ready}/{wanted} router pods Ready")
            failure = scheduling.creation_failure(deployment)
            if failure is not None:  # a pod that is not there cannot say why
                said = f"{ready}/{wanted} router pods Ready; one cannot be created: {failure}"
                ready_c = (False, scheduling.FAILED_CREATE, said)
                reconciling = (scheduling.FAILED_CREATE, said)
        owned = {
            "phase": phase,
            "endpoint": f"http://{router_object_name(name)}.{namespace}.svc:{spec.proxy.port}",
            "backends": [{k_: v for k_, v in b.items() if v is not None} for b in backends],
            "observedGeneration": spec.generation,
            "conditions": cond.merge(
                status.get("conditions"),
                cond.kstatus(ready=ready_c, reconciling=reconciling),
                now=rfc3339(self.clock()),
                observed_generation=spec.generation,
            ),
        }
        await self._patch_status(self.routers, body, pool_status.status_patch(owned, status))
        await self._retry_creation(Key(ROUTER, namespace, name), namespace,
                                   router_object_name(name), failure is not None, logger)


__all__ = ["LABEL_POOL", "Controller", "Key", "covers"]
