"""The router's only door to the Kubernetes API (the one sidecar module importing kr8s).

It implements `sidecar.kube_port.KubePort`: it reads and watches the namespace's
ModelPools and EndpointSlices (list, then watch from the list's version, resume after a
dropped connection, list again after 410 Gone), and writes a pool's `status.request` by
JSON Patch with a `test` op, exactly as docs/contracts.md section 2 says. It watches the
router's own ConfigMap the same way, so a new config applies as soon as it is written.
It also creates the core/v1 Events that `sidecar.events` decides on
(`sidecar.event_reporter.EventPort`).
Every call goes through `kubecore.client`: kr8s never reads a refusal itself, and a 401
renews the token on the same session; the watches are `kubecore.watch`'s list-then-watch.
Refusals and kr8s and httpx errors are translated here, once, into `KubeError` and
`Conflict`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import kr8s

from kubecore import client, watch
from kubecore.client import Client
from kubecore.pool_request import request_ops
from kubecore.refusal import Refusal
from sidecar.activator import (
    LastSwap,
    PoolRequest,
    PoolStatus,
    SwapProgress,
    WriteRequest,
)
from sidecar.endpoints import Endpoint, EndpointSlice
from sidecar.events import Post
from sidecar.kube_port import Changed, Conflict, Deleted, KubeError, Listed, WatchEvent
from sidecar.reload import ConfigData

logger = logging.getLogger(__name__)

POOL_API = "modelpool.dev/v1alpha1"
EVENT_API = "v1"
# Who reports the router's Events (core/v1 `reportingComponent` and `source.component`).
REPORTING_COMPONENT = "modelpool.dev/router"
SLICE_API = "discovery.k8s.io/v1"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
CORE_API = "v1"
_REQUEST_TIMEOUT = 15.0
_WATCH_SECONDS = 290  # the server ends each watch; we resume from the last version
_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)
# A watch waits out any failure, then resumes from the last version it saw.
_RETRY = watch.Retry(delay=lambda failures: _BACKOFF[min(failures, len(_BACKOFF)) - 1],
                     relist=False)

T = TypeVar("T")
Body = dict[str, Any]

__all__ = [
    "ConfigData",
    "Conflict",
    "KubeClient",
    "KubeError",
    "connect",
    "event_body",
    "parse_config_map",
    "parse_pool",
    "parse_slice",
]


async def connect(kubeconfig: str | None = None) -> KubeClient:
    """A client from `kubeconfig`, else KUBECONFIG or the in-cluster service account."""
    try:
        api = await client.connect(kubeconfig)
    except Exception as e:
        raise KubeError(f"cannot connect to the Kubernetes API: {e}") from e
    return KubeClient(api)


class KubeClient:
    def __init__(
        self, api: Any, *, wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._api = api
        self._client = Client(api, _refused, _translate)
        self._wall_clock = wall_clock
        # uid of every ModelPool seen, by (namespace, name): an Event's involvedObject
        # carries it, and `kubectl describe` finds a pool's Events by it.
        self._pool_uids: dict[tuple[str, str], str] = {}

    async def close(self) -> None:
        """Close the HTTP session (kr8s keeps it open for the client's lifetime)."""
        await client.close(self._api)

    # --- ModelPools ---

    async def get_pool(self, namespace: str, name: str) -> PoolStatus | None:
        try:
            body = await self._json("GET", POOL_API, namespace, f"modelpools/{name}")
        except _NotFound:
            return None
        return self._parse_pool(body)

    async def write_request(self, namespace: str, pool: str, write: WriteRequest) -> PoolStatus:
        ops = request_patch(write, self._wall_clock())
        try:
            body = await self._json(
                "PATCH",
                POOL_API,
                namespace,
                f"modelpools/{pool}/status",
                body=ops,
                content_type="application/json-patch+json",
            )
        except _NotFound as e:
            raise KubeError(f"ModelPool {namespace}/{pool} not found") from e
        return self._parse_pool(body)

    def watch_pools(
        self, namespace: str, name: str | None = None
    ) -> AsyncIterator[WatchEvent[PoolStatus]]:
        """The ModelPool `name` alone when given (the API server filters by field), else
        every ModelPool of the namespace."""
        return self._watch(POOL_API, namespace, "modelpools", self._parse_pool,
                           field_selector=None if name is None else f"metadata.name={name}")

    def _parse_pool(self, obj: Body) -> PoolStatus:
        meta = obj.get("metadata") or {}
        namespace, uid = meta.get("namespace"), meta.get("uid")
        if isinstance(namespace, str) and isinstance(uid, str):
            self._pool_uids[(namespace, str(meta.get("name", "")))] = uid
        return parse_pool(obj)

    # --- Events ---

    async def post_event(self, post: Post, instance: str) -> None:
        """Create the core/v1 Event `post` on its ModelPool; `instance` is this pod's name.
        Raises KubeError (a pool that is gone is one)."""
        uid = self._pool_uids.get((post.namespace, post.pool))
        if uid is None:
            if await self.get_pool(post.namespace, post.pool) is None:
                raise KubeError(f"ModelPool {post.namespace}/{post.pool} not found")
            uid = self._pool_uids.get((post.namespace, post.pool))
        body = event_body(post, uid, instance, self._wall_clock())
        # A router whose Role lacks Events (an older install) is answered 403: a KubeError.
        await self._json(
            "POST",
            EVENT_API,
            post.namespace,
            "events",
            body=body,
        )

    # --- EndpointSlices ---

    def watch_endpoint_slices(
        self, namespace: str, services: Collection[str] | None = None
    ) -> AsyncIterator[WatchEvent[EndpointSlice]]:
        """The slices of `services` alone when given (the API server filters them: a router
        hears of no other Service's endpoints), else every Service's in the namespace."""
        return self._watch(SLICE_API, namespace, "endpointslices", parse_slice,
                           label_selector=slice_selector(services))

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[EndpointSlice]:
        items, _ = await self._list(
            SLICE_API,
            namespace,
            "endpointslices",
            label_selector=f"{SERVICE_NAME_LABEL}={service}",
        )
        return [parse_slice(item) for item in items]

    # --- the router's own ConfigMap ---

    def watch_config_map(
        self, namespace: str, name: str
    ) -> AsyncGenerator[WatchEvent[ConfigData], None]:
        """The ConfigMap `name` alone (a field selector: the Role grants it by name)."""
        return self._watch(
            CORE_API, namespace, "configmaps", parse_config_map,
            field_selector=f"metadata.name={name}",
        )

    # --- plumbing ---

    async def _json(
        self, method: str, version: str, namespace: str, url: str, **kwargs: Any
    ) -> Body:
        what = f"{method} {url}"
        body = await self._client.json(
            what, method, version=version, namespace=namespace, url=url,
            timeout=_REQUEST_TIMEOUT, **kwargs,
        )
        if not isinstance(body, dict):
            raise KubeError(f"{what}: the API server answered {type(body).__name__}")
        return body

    async def _list(
        self,
        version: str,
        namespace: str,
        plural: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Body], str]:
        params = {"labelSelector": label_selector} if label_selector else {}
        if field_selector:
            params["fieldSelector"] = field_selector
        body = await self._json("GET", version, namespace, plural, params=params)
        items = list(body.get("items") or ())
        return items, str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(
        self,
        version: str,
        namespace: str,
        plural: str,
        parse: Callable[[Body], T],
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AsyncGenerator[WatchEvent[T], None]:
        """List, then watch from the list's version; on a dropped stream resume from the last
        version seen; on 410 Gone list again. Never ends on its own."""

        def events(resource_version: str) -> AsyncIterator[tuple[str, Body]]:
            return self._client.events(
                f"watch {plural}",
                version=version,
                namespace=namespace,
                url=plural,
                params=watch.watch_params(
                    resource_version,
                    _WATCH_SECONDS,
                    label_selector=label_selector,
                    field_selector=field_selector,
                ),
                # The server ends the watch after _WATCH_SECONDS; a read that waits longer
                # is a dead connection, which this timeout turns into a resume.
                timeout=httpx.Timeout(_REQUEST_TIMEOUT, read=_WATCH_SECONDS + 30),
            )

        changes = watch.list_then_watch(
            lambda: self._list(version, namespace, plural, label_selector, field_selector),
            events,
            what=plural,
            retry=_RETRY,
            logger=logger,
        )
        async with watch.closing(changes):
            async for change in changes:
                if isinstance(change, watch.Listed):
                    yield Listed(tuple(parse(item) for item in change.items))
                elif change.type == "DELETED":
                    yield Deleted(change.object["metadata"]["name"])
                else:
                    yield Changed(parse(change.object))


def slice_selector(services: Collection[str] | None) -> str:
    """The label selector of the EndpointSlices of `services` (None: of every Service)."""
    if services is None:
        return SERVICE_NAME_LABEL
    return f"{SERVICE_NAME_LABEL} in ({','.join(sorted(set(services)))})"


class _NotFound(KubeError):
    pass


def _refused(refusal: Refusal, what: str) -> Exception:
    """A refusal in our vocabulary: Conflict for a lost CAS, Gone for an expired version,
    _NotFound, else KubeError (worth retrying)."""
    if refusal.code in (409, 422):
        return Conflict(f"{what}: {refusal}")
    if refusal.code == 410:
        return watch.Gone()
    if refusal.code == 404:
        return _NotFound(f"{what}: not found")
    return KubeError(f"{what}: {refusal}")


def _translate(e: Exception, what: str) -> Exception:
    """kr8s and httpx errors in our vocabulary (a refusal is one already, see `_refused`)."""
    if isinstance(e, KubeError | watch.Gone):
        return e
    if isinstance(e, httpx.HTTPError | kr8s.APITimeoutError | OSError | ValueError | KeyError):
        return KubeError(f"{what}: {type(e).__name__}: {str(e)[:300]}")
    return e


# --- bodies -------------------------------------------------------------------------------


def event_body(post: Post, uid: str | None, instance: str, now: datetime) -> Body:
    """The core/v1 Event for `post` on its ModelPool, as `kubectl describe` shows it: the
    first and last timestamps span the notes it stands for, `count` is how many."""
    involved: Body = {
        "apiVersion": POOL_API,
        "kind": "ModelPool",
        "name": post.pool,
        "namespace": post.namespace,
    }
    if uid is not None:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{post.pool}.", "namespace": post.namespace},
        "involvedObject": involved,
        "type": post.type,
        "reason": post.reason,
        "message": post.message[:1024],
        "action": post.reason,
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": _seconds(now - timedelta(seconds=post.span)),
        "lastTimestamp": _seconds(now),
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "count": post.count,
    }


def _seconds(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def request_patch(write: WriteRequest, now: datetime) -> list[Body]:
    """The JSON Patch of docs/contracts.md section 2 for one compare-and-swap write."""
    value = {
        "member": write.request.member,
        "generation": write.request.generation,
        "requestedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "requestedBy": write.request.requested_by,
    }
    expected = write.expected.generation if write.expected is not None else None
    return request_ops(value, expected, write.resource_version, write.status_present)


def parse_pool(obj: Body) -> PoolStatus:
    meta = obj.get("metadata") or {}
    status = obj.get("status")
    present = isinstance(status, dict)
    st: Body = status if isinstance(status, dict) else {}
    return PoolStatus(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        status_present=present,
        resident_member=st.get("residentMember"),
        request=_request(st.get("request")),
        swap=_swap(st.get("swap"), st.get("conditions")),
        last_swap=_last_swap(st.get("lastSwap")),
        residents=_residents(st.get("residents")),
        loads=_loads(st.get("loads")),
        room_left=_count(st.get("roomLeft")),
        footprints=_footprints(st.get("members"), st.get("residents")),
    )


def _count(raw: Any) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else None


def _footprints(*lists: Any) -> dict[str, int]:
    """Each member's footprint in bytes, from a budgeted pool's `members` and `residents`
    entries (`gpuMemory`); none for an exclusive pool."""
    found: dict[str, int] = {}
    for raw in lists:
        for entry in raw if isinstance(raw, list) else ():
            if isinstance(entry, dict) and entry.get("name"):
                size = _count(entry.get("gpuMemory"))
                if size is not None:
                    found[str(entry["name"])] = size
    return found


def _residents(raw: Any) -> frozenset[str] | None:
    """A budgeted pool's resident names; None where the status has no `residents` list
    (an exclusive pool)."""
    if not isinstance(raw, list):
        return None
    return frozenset(
        str(r["name"]) for r in raw if isinstance(r, dict) and r.get("name")
    )


def _loads(raw: Any) -> tuple[SwapProgress, ...]:
    """A budgeted pool's loads under way, oldest first, each with its victims (`from` is
    the first of them, as in `swap`). What a load is stuck on is read from `swap` alone:
    the pool's Ready condition speaks of one load."""
    loads: list[SwapProgress] = []
    for x in raw if isinstance(raw, list) else ():
        if not isinstance(x, dict) or not x.get("to"):
            continue
        generation = x.get("generation")
        victims = x.get("victims")
        loads.append(
            SwapProgress(
                str(victims[0]) if isinstance(victims, list) and victims else None,
                str(x["to"]),
                generation if isinstance(generation, int) else None,
                str(x.get("phase") or ""),
                None,
                tuple(str(v) for v in victims) if isinstance(victims, list) else (),
                x.get("restores") is True,
            )
        )
    return tuple(loads)


def _request(raw: Any) -> PoolRequest | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("generation"), int):
        return None
    return PoolRequest(raw.get("member"), raw["generation"], raw.get("requestedBy"))


def _swap(raw: Any, conditions: Any) -> SwapProgress | None:
    if not isinstance(raw, dict) or not raw.get("to"):
        return None
    generation = raw.get("generation")
    return SwapProgress(
        raw.get("from"),
        str(raw["to"]),
        generation if isinstance(generation, int) else None,
        str(raw.get("phase") or ""),
        _stuck_on(conditions),
        restores=raw.get("restores") is True,
    )


def _stuck_on(conditions: Any) -> str | None:
    """While a swap runs, the pool's Ready condition has reason Swapping unless the swap
    is stuck (Unschedulable, FailedCreate, CrashLoopBackOff, ...): then its message."""
    for c in conditions if isinstance(conditions, list) else ():
        if not isinstance(c, dict) or c.get("type") != "Ready":
            continue
        if c.get("status") == "False" and c.get("reason") not in (None, "Swapping"):
            return str(c.get("message") or c.get("reason"))
    return None


def _last_swap(raw: Any) -> LastSwap | None:
    if not isinstance(raw, dict) or not raw.get("outcome"):
        return None
    generation = raw.get("generation")
    duration = raw.get("durationSeconds")
    return LastSwap(
        raw.get("from"),
        raw.get("to"),
        generation if isinstance(generation, int) else None,
        str(raw["outcome"]),
        float(duration) if isinstance(duration, int | float) else None,
        raw.get("reason"),
        raw.get("message"),
    )


def parse_config_map(obj: Body) -> ConfigData:
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    return ConfigData(
        str(meta.get("name", "")),
        {str(k): v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict)
        else {},
    )


def parse_slice(obj: Body) -> EndpointSlice:
    meta = obj.get("metadata") or {}
    ports = obj.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == "http"), None)
    if port is None and ports:
        port = ports[0].get("port")
    endpoints: list[Endpoint] = []
    for e in obj.get("endpoints") or ():
        # A missing `ready` condition means unknown, which consumers treat as ready.
        ready = (e.get("conditions") or {}).get("ready") is not False
        endpoints.extend(Endpoint(str(a), ready) for a in e.get("addresses") or ())
    return EndpointSlice(
        name=str(meta.get("name", "")),
        service=str((meta.get("labels") or {}).get(SERVICE_NAME_LABEL, "")),
        port=port if isinstance(port, int) else None,
        endpoints=tuple(endpoints),
    )
