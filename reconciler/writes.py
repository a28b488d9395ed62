"""Every write the reconciler makes to the API server: apply and prune what an object
renders, patch status, write a Stalled or waiting status, post Events, clear a pool's
request, lift a pod's slot gate, retry a Deployment whose pods cannot be created, and the
prewarm pod. Each write is counted, and what the API server returns is put back into the
watch cache at once; nothing is written unless it differs from what the API server holds,
so an idle reconciler makes no writes."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from reconciler import conditions as cond
from reconciler import kube as k
from reconciler import scheduling
from reconciler.logs import ObjectLogger
from reconciler.merge_patch import status_patch
from reconciler.metrics import ReconcilerMetrics
from reconciler.objects import covers, meta, owned_by, pod_active
from reconciler.render import LABEL_SERVER, MANAGED_BY, SLOT_GATE
from reconciler.settling import WAITING_FOR_SERVER
from reconciler.stores import MANAGED, POOL, SERVER, Stores
from reconciler.timefmt import rfc3339

log = logging.getLogger(__name__)

APPLY_REFUSED = "ApplyRefused"  # the API server refused a rendered object
# Set on a Deployment whose pods cannot be created, each time the reconciler retries it;
# the Deployment controller copies it to the ReplicaSet, whose controller then tries again.
CREATE_RETRIED = "modelpool.dev/create-retried-at"
APPLIED_MEMO_SIZE = 16384


# An Event repeated within this long is counted on the one posted (client-go's recorder
# keeps a series for ten minutes too); at most this many are remembered.
EVENT_SERIES_SECONDS = 600.0
EVENT_SERIES_KEPT = 4096


class Writer:
    def __init__(self, kube: k.Kube, metrics: ReconcilerMetrics, stores: Stores,
                 clock: Callable[[], float], identity: str,
                 create_retry_seconds: float) -> None:
        """`identity` is this instance's (its leader election identity): it signs the
        Events it posts and the requests it clears."""
        self.kube = kube
        self.metrics = metrics
        self.stores = stores
        self.clock = clock
        self.identity = identity
        self.create_retry_seconds = create_retry_seconds
        # A digest of the body last applied per (apiVersion, kind, namespace, name).
        self._applied: dict[tuple[str, str, str, str], bytes] = {}
        # When each Deployment whose pods cannot be created was last retried (or first
        # seen failing), by (namespace, name): see `retry_creation`.
        self._create_retried: dict[tuple[str, str], float] = {}
        # The Events posted lately, by (namespace, kind, name, uid, type, reason, message):
        # (the Event's name, its count, when last posted or counted); see `post_event`.
        self._events: dict[tuple[str, ...], tuple[str, int, float]] = {}

    # Rendered objects

    async def apply(self, body: dict[str, Any]) -> None:
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
        cache = self.stores.of_kind(api_version, kind)
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

    async def apply_for(self, body: Mapping[str, Any], logger: ObjectLogger,
                        objects: Sequence[dict[str, Any]]) -> None:
        """Apply what `body` (a ModelServer or a ModelRouter) renders. A refusal that
        trying again will not change by itself (an admission policy, a webhook, a quota:
        400, 403, 422) stalls `body`, naming the object and the API server's words, before
        it is raised again to be retried with backoff, so `kubectl describe` says what
        the log says. A namespace being deleted refuses with 403 too: that is no stall,
        the object goes with its namespace (`k.NamespaceTerminating`)."""
        for obj in objects:
            try:
                await self.apply(obj)
            except k.KubeError as e:
                if e.status in (400, 403, 422) and not isinstance(e, k.NamespaceTerminating):
                    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
                    await self.write_stalled(body, logger, APPLY_REFUSED,
                                             f"{kind} {name} was refused: {e}")
                raise

    async def prune(
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
            cache = self.stores.of_kind(api_version, kind)
            resource = k.BY_KIND[(api_version, kind)]
            if cache is not None:
                candidates = cache.indexed(label, namespace, value)
            else:
                candidates, _ = await self.kube.list_all(
                    resource, namespace, f"{label}={value},{MANAGED}"
                )
            for obj in candidates:
                name = str(meta(obj).get("name"))
                if (kind, name) in keep or not owned_by(obj, owner_uid):
                    continue
                log.info("pruning %s %s/%s", kind, namespace, name)
                await self.kube.delete(resource, namespace, name, meta(obj).get("uid"))
                self._applied.pop((api_version, kind, namespace, name), None)
                self.metrics.api_writes_total.labels("delete", kind).inc()

    async def retry_creation(self, namespace: str, deployment: str, failing: bool,
                             logger: ObjectLogger) -> float | None:
        """While the pods of `deployment` cannot be created (`failing`: its ReplicaFailure
        condition, no pod), have its ReplicaSet try again every `create_retry_seconds`;
        returns when its owner is to be looked at again (None while not failing). The
        ReplicaSet controller's own retries back off to minutes
        (`scheduling.creation_retry`); an annotation on the Deployment, which the
        Deployment controller copies to the ReplicaSet, puts the ReplicaSet back in its
        controller's queue at once. So a pool recovers within that period of the cause
        going (a namespace's Pod Security level lowered, a quota raised)."""
        name = (namespace, deployment)
        if not failing:
            self._create_retried.pop(name, None)
            return None
        now = self.clock()
        last = self._create_retried.setdefault(name, now)  # its controller just tried
        due, wait = scheduling.creation_retry(last, now, self.create_retry_seconds)
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
        return wait

    def forget_creation(self, namespace: str, deployment: str) -> None:
        """`deployment`'s owner is gone: no retry of its pods is remembered."""
        self._create_retried.pop((namespace, deployment), None)

    # Status

    async def patch_status(
        self, informer: k.Informer, obj: Mapping[str, Any], patch: Mapping[str, Any]
    ) -> None:
        if not patch:
            return
        ns, name = k.key_of(obj)
        result = await self.kube.merge_patch_status(informer.resource, ns, name, patch)
        self.metrics.api_writes_total.labels("patch-status", informer.resource.kind).inc()
        informer.update(result)

    async def write_status(self, informer: k.Informer, body: Mapping[str, Any],
                           owned: Mapping[str, Any]) -> None:
        """Bring the status fields the reconciler owns to `owned` (written only if they
        differ)."""
        await self.patch_status(informer, body, status_patch(owned, body.get("status")))

    async def warn_once(self, body: Mapping[str, Any], logger: ObjectLogger,
                        stalled: tuple[str, str]) -> None:
        """An Event for a Stalled reason the object's status does not show yet."""
        before = cond.find((body.get("status") or {}).get("conditions"), cond.STALLED)
        if before is None or before.get("status") != "True" or before.get("reason") != stalled[0]:
            await logger.event("Warning", *stalled)

    async def write_stalled(self, body: Mapping[str, Any], logger: ObjectLogger,
                            reason: str, message: str) -> None:
        """Mark a ModelServer or a ModelRouter Stalled (and not Ready) for `reason`, with a
        Warning the first time."""
        await self.warn_once(body, logger, (reason, message))
        await self._write_conditions(
            body, ready=(False, reason, message), stalled=(reason, message))

    async def write_waiting(self, body: Mapping[str, Any], message: str) -> None:
        """A router just applied or changed whose ModelServer is not seen yet: Reconciling,
        not Stalled (`settling`)."""
        waiting = (WAITING_FOR_SERVER, message.replace("which does not exist", "not seen yet"))
        await self._write_conditions(body, ready=(False, *waiting), reconciling=waiting)

    async def _write_conditions(self, body: Mapping[str, Any], ready: tuple[bool, str, str],
                                reconciling: tuple[str, str] | None = None,
                                stalled: tuple[str, str] | None = None) -> None:
        status = body.get("status") or {}
        generation = int(meta(body).get("generation") or 0)
        owned = {
            "observedGeneration": generation,
            "conditions": cond.merge(
                status.get("conditions"),
                cond.kstatus(ready=ready, reconciling=reconciling, stalled=stalled),
                now=rfc3339(self.clock()),
                observed_generation=generation,
            ),
        }
        informer = self.stores.servers if body.get("kind") == SERVER else self.stores.routers
        await self.write_status(informer, body, owned)

    # Events

    async def post_event(self, body: Mapping[str, Any], type_: str, reason: str,
                         message: str) -> None:
        """An Event about `body`. One this reconciler posted about the same object, of the
        same type, reason and message, less than EVENT_SERIES_SECONDS ago is counted
        again (its `count` and `lastTimestamp`) instead, as client-go's recorder does: a
        condition that comes and goes shows once, `x2` in `kubectl describe`."""
        m = meta(body)
        namespace = str(m.get("namespace") or "default")
        key = (namespace, str(body.get("kind")), str(m.get("name")), str(m.get("uid")),
               type_, reason, message)
        now = self.clock()
        seen = self._events.pop(key, None)
        if seen is not None and now - seen[2] < EVENT_SERIES_SECONDS:
            name, count, _ = seen
            try:
                await self.kube.count_event(namespace, name, count + 1, now)
            except k.NotFound:
                pass  # gone (expired, deleted): posted anew
            else:
                self._events[key] = (name, count + 1, now)
                self.metrics.api_writes_total.labels("patch", "Event").inc()
                return
        posted = await self.kube.post_event(body, type_=type_, reason=reason,
                                            message=message, now=now, instance=self.identity)
        self.metrics.api_writes_total.labels("create", "Event").inc()
        if posted is not None:
            self._events[key] = (posted, 1, now)
            while len(self._events) > EVENT_SERIES_KEPT:
                del self._events[next(iter(self._events))]  # the least recently posted

    def logger(self, body: Mapping[str, Any], to: logging.Logger) -> ObjectLogger:
        """A logger for `body`, writing to `to`, whose events are posted as Kubernetes
        Events. A Warning posted before a stall is written is refused in a namespace being
        deleted: that ends the reconcile there, so nothing going away is called Stalled."""
        return ObjectLogger(to, body, self.post_event, final=(k.NamespaceTerminating,))

    # Pools

    async def clear_request(self, namespace: str, pool: str, generation: int,
                            logger: ObjectLogger) -> bool:
        """Clear a pool's status.request if it is still generation `generation`; False
        when it was replaced first (then the pool is to be looked at again)."""
        cleared = {
            "member": None,
            "requestedAt": rfc3339(self.clock()),
            "requestedBy": f"{namespace}/{MANAGED_BY}/{self.identity}",
        }
        try:
            result = await self.kube.json_patch_status(
                k.MODEL_POOLS, namespace, pool, k.clear_request_ops(generation, cleared)
            )
        except k.Conflict:
            logger.info("request %d was replaced before it could be cleared", generation)
            return False
        self.metrics.api_writes_total.labels("json-patch-status", POOL).inc()
        self.stores.pools.update(result)
        return True

    async def release(self, namespace: str, members: Collection[str],
                      logger: ObjectLogger) -> None:
        """Lift the slot gate of the pods of `members`: the scheduler places them from then
        on."""
        member_pods = ((m, pod) for m in sorted(set(members))
                       for pod in self.stores.pods.indexed(LABEL_SERVER, namespace, m))
        for member, pod in member_pods:
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            if (not pod_active(pod)
                    or meta(pod).get("deletionTimestamp")
                    or not any(g.get("name") == SLOT_GATE for g in gates)):
                continue
            name = str(meta(pod).get("name"))
            try:
                await self.kube.strategic_merge_patch(k.PODS, namespace, name, {
                    "spec": {"schedulingGates": [{"$patch": "delete", "name": SLOT_GATE}]}})
            except k.NotFound:
                continue  # gone already: its ReplicaSet makes another, released in turn
            self.metrics.api_writes_total.labels("patch", "Pod").inc()
            logger.info("released %s's pod %s to the scheduler", member, name)

    async def apply_pod(self, pod: dict[str, Any]) -> None:
        """Create (or apply) a pod the reconciler runs itself: the prewarm pod."""
        await self.kube.apply(pod)
        self.metrics.api_writes_total.labels("apply", "Pod").inc()

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self.kube.delete(k.PODS, namespace, name)
        self.metrics.api_writes_total.labels("delete", "Pod").inc()
