"""The reconciler's one door to the API server; the only module of it that imports kr8s.

Everything the reconciler does to the cluster goes through here: list and watch (resumed
after `410 Gone` by listing again, never by polling; `kubecore.watch`), server-side apply
with one field manager (kr8s has none: one helper sends `application/apply-patch+yaml`
through `api.call_api`), merge patches of status, the JSON-patch compare-and-swap on a
pool's `status.request` (`kubecore.pool_request`), deletes for pruning, Events and the
leader Lease. Every call goes through `kubecore.client`: kr8s never reads a refusal itself,
and a 401 renews the token on the same session. Refusals and kr8s and httpx errors are
translated once, in `_refused` and `_translate`, into `KubeError`s that say whether trying
again can help.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import kr8s

from kubecore import client, watch
from kubecore.client import Client
from kubecore.pool_request import clear_request_ops as clear_request_ops
from kubecore.refusal import Refusal
from reconciler.timefmt import rfc3339, rfc3339_micro

log = logging.getLogger(__name__)

FIELD_MANAGER = "modelpool-reconciler"
REQUEST_TIMEOUT = 30.0
WATCH_SECONDS = 290  # the server ends a watch after this; it is resumed from its last version
_TRUNCATE = 300


class KubeError(Exception):
    """A request to the API server failed; `status` is the HTTP code when there was one."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def temporary(self) -> bool:
        """Trying again later can help (conflicts, throttling, server and network trouble)."""
        return self.status is None or self.status in (409, 429) or self.status >= 500


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409, or 422 from a failed JSON-patch `test`: re-read and re-decide."""


class Gone(KubeError, watch.Gone):
    """410: the resourceVersion a watch resumed from is too old; list again."""


class NamespaceTerminating(KubeError):
    """403: the object's namespace is being deleted and takes nothing new. Its objects go
    with it; trying again cannot help."""


@dataclass(frozen=True)
class Resource:
    api_version: str  # "v1", "apps/v1", "modelpool.dev/v1alpha1"
    kind: str
    plural: str
    namespaced: bool = True

    def url(self, name: str | None = None, sub: str | None = None) -> str:
        return "/".join(p for p in (self.plural, name, sub) if p)


MODEL_SERVERS = Resource("modelpool.dev/v1alpha1", "ModelServer", "modelservers")
MODEL_POOLS = Resource("modelpool.dev/v1alpha1", "ModelPool", "modelpools")
MODEL_ROUTERS = Resource("modelpool.dev/v1alpha1", "ModelRouter", "modelrouters")
DEPLOYMENTS = Resource("apps/v1", "Deployment", "deployments")
SERVICES = Resource("v1", "Service", "services")
CONFIG_MAPS = Resource("v1", "ConfigMap", "configmaps")
SERVICE_ACCOUNTS = Resource("v1", "ServiceAccount", "serviceaccounts")
ROLES = Resource("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
PODS = Resource("v1", "Pod", "pods")
VOLUME_CLAIMS = Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
EVENTS = Resource("v1", "Event", "events")
LEASES = Resource("coordination.k8s.io/v1", "Lease", "leases")
NETWORK_POLICIES = Resource("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
# Dynamic Resource Allocation: a claim pool's ResourceClaim, the devices drivers publish,
# their classes. Watched only where the API server serves them (`Kube.discover`).
RESOURCE_CLAIMS = Resource("resource.k8s.io/v1", "ResourceClaim", "resourceclaims")
RESOURCE_SLICES = Resource("resource.k8s.io/v1", "ResourceSlice", "resourceslices",
                           namespaced=False)
DEVICE_CLASSES = Resource("resource.k8s.io/v1", "DeviceClass", "deviceclasses",
                          namespaced=False)

BY_KIND: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (
        MODEL_SERVERS, MODEL_POOLS, MODEL_ROUTERS, DEPLOYMENTS, SERVICES, CONFIG_MAPS,
        SERVICE_ACCOUNTS, ROLES, ROLE_BINDINGS, PODS, EVENTS, LEASES, NETWORK_POLICIES,
        RESOURCE_CLAIMS, RESOURCE_SLICES, DEVICE_CLASSES, VOLUME_CLAIMS,
    )
}


def resource_of(body: Mapping[str, Any]) -> Resource:
    key = (str(body.get("apiVersion")), str(body.get("kind")))
    try:
        return BY_KIND[key]
    except KeyError:
        raise KubeError(f"no resource known for {key[0]} {key[1]}") from None


def _refused(refusal: Refusal, what: str) -> KubeError:
    """A refusal as the KubeError that says what to do about it."""
    message = f"{what}: {refusal.message or refusal}"
    if refusal.code == 404:
        return NotFound(message, 404, refusal.reason)
    if refusal.code in (409, 422):
        return Conflict(message, refusal.code, refusal.reason)
    if refusal.code == 410:
        return Gone(message, 410, refusal.reason)
    if refusal.namespace_terminating:
        return NamespaceTerminating(message, refusal.code, refusal.reason)
    return KubeError(message, refusal.code, refusal.reason)


def _translate(e: Exception, what: str) -> Exception:
    """Every kr8s/httpx failure as one of ours, with the server's message, truncated;
    anything else as it is."""
    if isinstance(e, kr8s.APITimeoutError | httpx.TimeoutException):
        return KubeError(f"{what}: timed out")
    if isinstance(e, httpx.HTTPError | OSError):
        return KubeError(f"{what}: {type(e).__name__}: {str(e)[:_TRUNCATE]}")
    return e


def verb_of(method: str, name: str | None, content_type: str) -> str:
    """The Kubernetes verb of one request, as the API server's own metrics name it."""
    if method == "GET":
        return "get" if name else "list"
    if method == "PATCH" and content_type == "application/apply-patch+yaml":
        return "apply"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower())


# Told of every request sent: (verb, resource), the resource as `plural` or `plural/sub`.
OnRequest = Callable[[str, str], None]


class Kube:
    """Typed calls on one kr8s `Api` (injected; see `connect`)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._client = Client(api, _refused, _translate)
        # Counts what is sent (the reconciler's requests metric); set once, at the start.
        self.on_request: OnRequest | None = None

    def _count(self, verb: str, resource: Resource, sub: str | None = None) -> None:
        if self.on_request is not None:
            self.on_request(verb, f"{resource.plural}/{sub}" if sub else resource.plural)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        """A client from `kubeconfig`, else the pod's service account (kr8s's defaults)."""
        return cls(await client.connect(kubeconfig))

    async def request(
        self,
        method: str,
        resource: Resource,
        namespace: str | None,
        name: str | None = None,
        *,
        sub: str | None = None,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        what = f"{method} {resource.url(name, sub)} in {namespace or '(cluster)'}"
        self._count(verb_of(method, name, content_type), resource, sub)
        data = await self._client.json(
            what,
            method,
            body=body,
            content_type=content_type,
            params=params,
            version=resource.api_version,
            namespace=namespace if resource.namespaced else None,
            url=resource.url(name, sub),
            timeout=REQUEST_TIMEOUT,
        )
        return data if isinstance(data, dict) else {}

    async def discover(self, group_version: str) -> dict[str, Any] | None:
        """The API server's discovery answer for `group_version` (an APIResourceList),
        None where it does not serve that group version."""
        try:
            data = await self._client.json(f"GET /apis/{group_version}", "GET", base="/apis",
                                           version="", url=group_version,
                                           timeout=REQUEST_TIMEOUT)
        except NotFound:
            return None
        return data if isinstance(data, dict) else {}

    async def list_refused(self, resource: Resource, namespace: str | None) -> str | None:
        """Why this client may not list `resource` (in `namespace`, or the cluster), in the
        API server's words; None when it may."""
        try:
            await self.request("GET", resource, namespace, params={"limit": "1"})
        except KubeError as e:
            if e.status in (401, 403):
                return str(e)
            raise
        return None

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self.request("GET", resource, namespace, name)
        except NotFound:
            return None

    async def list_all(
        self, resource: Resource, namespace: str | None, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object (all pages) and the list's resourceVersion."""
        params: dict[str, str] = {"limit": "500"}
        if label_selector:
            params["labelSelector"] = label_selector
        items: list[dict[str, Any]] = []
        while True:
            page = await self.request("GET", resource, namespace, params=params)
            for item in page.get("items") or []:
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
                items.append(item)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = str(meta["continue"])

    async def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) from `resource_version` on, bookmarks included, until the server
        ends the watch; raises Gone when that version is too old."""
        self._count("watch", resource)
        events = self._client.events(
            f"watch {resource.plural} {namespace or '(all)'}",
            version=resource.api_version,
            namespace=namespace if resource.namespaced else None,
            url=resource.url(),
            params=watch.watch_params(
                resource_version, WATCH_SECONDS, label_selector=label_selector
            ),
            timeout=httpx.Timeout(REQUEST_TIMEOUT, read=WATCH_SECONDS + 30),
        )
        async with watch.closing(events):
            async for event in events:
                yield event

    async def apply(self, body: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply of one object we own, as field manager modelpool-reconciler."""
        resource = resource_of(body)
        meta = body.get("metadata") or {}
        return await self.request(
            "PATCH",
            resource,
            meta.get("namespace"),
            meta.get("name"),
            params={"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"},
            body=body,
            content_type="application/apply-patch+yaml",
        )

    async def strategic_merge_patch(
        self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A strategic merge patch of an object others own (a pod's scheduling gates)."""
        return await self._patch(resource, namespace, name, dict(patch),
                                 "application/strategic-merge-patch+json")

    async def merge_patch_status(
        self, resource: Resource, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self._patch_status(
            resource, namespace, name, {"status": dict(status)}, "application/merge-patch+json"
        )

    async def json_patch_status(
        self, resource: Resource, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A JSON Patch on the status subresource; a failed `test` raises Conflict."""
        return await self._patch_status(
            resource, namespace, name, ops, "application/json-patch+json"
        )

    async def _patch_status(
        self, resource: Resource, namespace: str, name: str, body: Any, content_type: str
    ) -> dict[str, Any]:
        return await self._patch(resource, namespace, name, body, content_type, sub="status")

    async def _patch(
        self, resource: Resource, namespace: str | None, name: str, body: Any,
        content_type: str, sub: str | None = None,
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH",
            resource,
            namespace,
            name,
            sub=sub,
            params={"fieldManager": FIELD_MANAGER},
            body=body,
            content_type=content_type,
        )

    async def delete(
        self, resource: Resource, namespace: str | None, name: str, uid: str | None = None
    ) -> None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                                "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        with contextlib.suppress(NotFound):
            await self.request("DELETE", resource, namespace, name, body=body)

    async def create(
        self, resource: Resource, namespace: str | None, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self.request("POST", resource, namespace, body=body)

    async def replace(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """PUT: fails with Conflict when body's resourceVersion is no longer current."""
        return await self.request("PUT", resource, namespace, name, body=body)

    async def post_event(
        self,
        involved: Mapping[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        now: float,
        instance: str,
    ) -> str | None:
        """A core/v1 Event about `involved` (an object body), as `kubectl describe` shows;
        its name."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        stamp = rfc3339(now)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": instance or FIELD_MANAGER,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "eventTime": rfc3339_micro(now),
            "action": reason,
            "count": 1,
        }
        created = await self.create(EVENTS, namespace, event)
        name = (created.get("metadata") or {}).get("name")
        return name if isinstance(name, str) else None

    async def count_event(self, namespace: str, name: str, count: int, now: float) -> None:
        """Another occurrence of the Event `name`: its `count` and `lastTimestamp`."""
        await self._patch(EVENTS, namespace, name,
                          {"count": count, "lastTimestamp": rfc3339(now)},
                          "application/merge-patch+json")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await client.close(self.api)


def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


OnChange = Callable[[str, dict[str, Any]], Awaitable[None] | None]
# The values an object is found by in one index (a label's value, a pool's member names).
Indexer = Callable[[Mapping[str, Any]], Iterable[str]]
CacheKey = tuple[str, str]


def label_indexer(label: str) -> Indexer:
    """Index objects by the value of one label."""
    def values(obj: Mapping[str, Any]) -> Iterable[str]:
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        return (value,) if isinstance(value, str) and value else ()
    return values


class IndexedCache(dict[CacheKey, dict[str, Any]]):
    """A watch cache, by (namespace, name), that also finds objects by index value without
    scanning: what one object's reconcile reads of the others costs the same however many
    there are. Every write of the dict keeps the indexes (tests write it directly too)."""

    def __init__(self, indexers: Mapping[str, Indexer],
                 items: Iterable[tuple[CacheKey, dict[str, Any]]] = ()) -> None:
        super().__init__()
        self._indexers = dict(indexers)
        # index -> (namespace, value) -> keys, and index -> key -> the values it was filed under
        self._index: dict[str, dict[tuple[str, str], set[CacheKey]]] = {
            name: {} for name in self._indexers}
        self._filed: dict[str, dict[CacheKey, tuple[str, ...]]] = {
            name: {} for name in self._indexers}
        for key, obj in items:
            self[key] = obj

    def __setitem__(self, key: CacheKey, obj: dict[str, Any]) -> None:
        self._unfile(key)
        super().__setitem__(key, obj)
        for name, indexer in self._indexers.items():
            values = tuple(sorted(set(indexer(obj))))
            self._filed[name][key] = values
            for value in values:
                self._index[name].setdefault((key[0], value), set()).add(key)

    def __delitem__(self, key: CacheKey) -> None:
        super().__delitem__(key)
        self._unfile(key)

    def pop(self, key: CacheKey, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        obj = super().pop(key)
        self._unfile(key)
        return obj

    def _unfile(self, key: CacheKey) -> None:
        for name, filed in self._filed.items():
            for value in filed.pop(key, ()):
                keys = self._index[name].get((key[0], value))
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[name][(key[0], value)]

    def indexed(self, index: str, namespace: str, value: str) -> list[dict[str, Any]]:
        """The objects of `namespace` filed under `value` in `index`, by name."""
        keys = self._index[index].get((namespace, value), ())
        return [dict.__getitem__(self, k) for k in sorted(keys)]


MAX_TOMBSTONES = 4096

# A failed list or watch is waited out (doubling, up to 30 s, with jitter), then listed again.
RETRY = watch.Retry(
    delay=lambda failures: min(30.0, 0.5 * 2 ** min(failures, 6)) * (1 + 0.2 * random.random()),
    failures=(KubeError,),
)


class Informer:
    """A cache of one resource kept current by list-then-watch; calls `on_change(type,
    obj)` for every change (and DELETED for objects that vanished across a re-list)."""

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        namespace: str | None,
        on_change: OnChange,
        label_selector: str | None = None,
        indexers: Mapping[str, Indexer] | None = None,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_change = on_change
        self._indexers = dict(indexers or {})
        self.cache = IndexedCache(self._indexers)
        self.synced = asyncio.Event()
        # Where the cache last learnt a key was absent: the resourceVersion of its DELETED
        # event, else that of the last list (`_floor`). A write of ours that was answered
        # before the delete but returns after it must not bring the object back.
        self._gone: dict[tuple[str, str], int] = {}
        self._floor = 0

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cache.get((namespace, name))

    def items(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [o for (ns, _), o in self.cache.items() if namespace is None or ns == namespace]

    def indexed(self, index: str, namespace: str, value: str) -> list[dict[str, Any]]:
        """The objects of `namespace` that `index` files under `value` (no scan)."""
        return self.cache.indexed(index, namespace, value)

    def update(self, obj: dict[str, Any]) -> None:
        """Put an object we just wrote into the cache, unless the cache has a newer one or
        has seen it deleted since."""
        key = key_of(obj)
        old = self.cache.get(key)
        # absent: newer than its deletion (or the last list) is new; else newer than the cached
        floor = self._gone.get(key, self._floor) + 1 if old is None else _rv(old)
        if _rv(obj) >= floor:
            self._gone.pop(key, None)
            obj.setdefault("apiVersion", self.resource.api_version)
            obj.setdefault("kind", self.resource.kind)
            self.cache[key] = obj

    def _forget(self, key: tuple[str, str], deleted_at: int) -> None:
        self._gone[key] = deleted_at
        if len(self._gone) > MAX_TOMBSTONES:
            # the oldest deletion is forgotten by raising the floor past it: a write of a
            # new object below the floor then waits for its own watch event to be cached
            oldest = next(iter(self._gone))
            self._floor = max(self._floor, self._gone.pop(oldest))

    async def _emit(self, type_: str, obj: dict[str, Any]) -> None:
        result = self.on_change(type_, obj)
        if result is not None:
            await result

    async def run(self) -> None:
        changes = watch.list_then_watch(
            lambda: self.kube.list_all(self.resource, self.namespace, self.label_selector),
            lambda version: self.kube.watch(
                self.resource, self.namespace, version, self.label_selector
            ),
            what=self.resource.plural,
            retry=RETRY,
            logger=log,
        )
        async with watch.closing(changes):
            async for change in changes:
                if isinstance(change, watch.Listed):
                    await self._listed(change)
                else:
                    await self._changed(change)

    async def _changed(self, change: watch.Event) -> None:
        obj = change.object
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        key = key_of(obj)
        if change.type == "DELETED":
            self.cache.pop(key, None)
            self._forget(key, _rv(obj))
        else:
            # the event of an earlier write may arrive after `update` put our newer answer
            # in the cache: never go back to an older one
            self.update(obj)
        await self._emit(change.type, obj)

    async def _listed(self, listed: watch.Listed) -> None:
        fresh = IndexedCache(self._indexers, ((key_of(o), o) for o in listed.items))
        gone = [o for k, o in self.cache.items() if k not in fresh]
        self.cache = fresh
        self._gone.clear()
        self._floor = _rv({"metadata": {"resourceVersion": listed.version}})
        for obj in gone:
            await self._emit("DELETED", obj)
        for obj in listed.items:
            await self._emit("SYNC", obj)
        self.synced.set()


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion", 0))
    except (TypeError, ValueError):
        return 0
