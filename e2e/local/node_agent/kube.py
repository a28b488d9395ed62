"""Every call the node agent (and its test client) makes to the API server.

The only module of the package that imports kr8s. Bodies go in and come out as plain
dicts; refusals and kr8s and httpx errors are translated here into `ApiError` and its
kinds, so the rest of the agent speaks one error vocabulary. Every call goes through
`kubecore.client`: kr8s never reads a refusal itself (`kubecore.refusal` says why; the
agent posts Events into namespaces that may be going away).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import kr8s

from kubecore import client, watch
from kubecore.client import Client
from kubecore.refusal import Refusal

Json = dict[str, Any]

# No request may hang the agent: a stalled call fails and is retried by its loop. A watch
# may stay silent (bookmarks come about once a minute) for up to its server-side timeout.
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
WATCH_SECONDS = 240
WATCH_TIMEOUT = httpx.Timeout(30.0, connect=5.0, read=WATCH_SECONDS + 30.0)


class ApiError(Exception):
    """A request the API server refused or could not answer; `status` is the HTTP code
    (0 when there was no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class Gone(ApiError, watch.Gone):
    """The watch's resourceVersion is too old: list again."""


class Forbidden(ApiError):
    pass


_KINDS: Mapping[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone, 403: Forbidden}


def _refused(refusal: Refusal, what: str) -> ApiError:
    return _KINDS.get(refusal.code, ApiError)(refusal.code, refusal.message)


def _translate(error: Exception, what: str) -> Exception:
    """A failure to reach the API server as an ApiError of status 0; others as they are."""
    if isinstance(error, kr8s.APITimeoutError | httpx.HTTPError | OSError):
        return ApiError(0, f"{type(error).__name__}: {error}"[:500])
    return error


class Kube:
    """A thin client over one kr8s `Api` (injected)."""

    def __init__(self, api: Any) -> None:
        self._client = Client(api, _refused, _translate)

    @classmethod
    async def connect(cls, kubeconfig: str) -> Kube:
        return cls(await client.connect(kubeconfig))

    async def request(
        self,
        method: str,
        version: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Json:
        result: Json = await self._client.json(
            f"{method} {url}", method, body=body, content_type=content_type, params=params,
            version=version, url=url, timeout=REQUEST_TIMEOUT,
        )
        return result

    # Node and Lease

    async def ensure_node(self, body: Mapping[str, Any]) -> Json:
        name = body["metadata"]["name"]
        try:
            return await self.request("POST", "v1", "nodes", body=body)
        except Conflict:
            patch = {"metadata": {"labels": body["metadata"]["labels"]}}
            return await self.request(
                "PATCH", "v1", f"nodes/{name}", body=patch,
                content_type="application/merge-patch+json",
            )

    async def patch_node_status(self, name: str, status: Mapping[str, Any]) -> Json:
        return await self.request(
            "PATCH", "v1", f"nodes/{name}/status", body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def renew_lease(self, body: Mapping[str, Any]) -> Json:
        name = body["metadata"]["name"]
        url = f"namespaces/kube-node-lease/leases/{name}"
        version = "coordination.k8s.io/v1"
        try:
            return await self.request(
                "PATCH", version, url, body={"spec": body["spec"]},
                content_type="application/merge-patch+json",
            )
        except NotFound:
            return await self.request(
                "POST", version, "namespaces/kube-node-lease/leases", body=body
            )

    # Pods

    async def list_pods(self, node: str) -> tuple[list[Json], str]:
        return await self.list("pods", f"spec.nodeName={node}")

    async def watch_pods(self, node: str, resource_version: str) -> AsyncIterator[tuple[str, Json]]:
        events = self.watch("pods", resource_version, f"spec.nodeName={node}")
        async with watch.closing(events):
            async for event in events:
                yield event

    async def list(self, plural: str, field_selector: str = "") -> tuple[list[Json], str]:
        """Every object of a core (v1) kind in all namespaces, and the list's version."""
        params = {"fieldSelector": field_selector} if field_selector else None
        result = await self.request("GET", "v1", plural, params=params)
        return list(result.get("items") or []), str(result["metadata"]["resourceVersion"])

    async def watch(
        self, plural: str, resource_version: str, field_selector: str = ""
    ) -> AsyncIterator[tuple[str, Json]]:
        """Events of a core (v1) kind after `resource_version` until the server ends the
        watch; raises Gone when that version is too old. Bookmarks come as `BOOKMARK`."""
        params = watch.watch_params(resource_version, WATCH_SECONDS, field_selector=field_selector)
        events = self._client.events(
            f"watch {plural}", version="v1", url=plural, params=params, timeout=WATCH_TIMEOUT
        )
        async with watch.closing(events):
            async for event in events:
                yield event

    async def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Json:
        return await self.request(
            "PATCH", "v1", f"namespaces/{namespace}/pods/{name}/status",
            body={"status": status}, content_type="application/merge-patch+json",
        )

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        with contextlib.suppress(NotFound, Conflict):
            await self.request("DELETE", "v1", f"namespaces/{namespace}/pods/{name}", body=body)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        await self.request("POST", "v1", f"namespaces/{namespace}/events", body=body)

    async def get(self, version: str, url: str) -> Json | None:
        """An object, or None when it does not exist."""
        try:
            return await self.request("GET", version, url)
        except NotFound:
            return None

    async def request_token(
        self,
        namespace: str,
        service_account: str,
        pod_name: str,
        pod_uid: str,
        audience: str,
        expiration_seconds: int,
    ) -> tuple[str, str]:
        """A TokenRequest token bound to the pod, and its expiry (RFC 3339)."""
        spec: Json = {
            "expirationSeconds": expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid},
        }
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        result = await self.request(
            "POST", "v1", f"namespaces/{namespace}/serviceaccounts/{service_account}/token",
            body=body,
        )
        return str(result["status"]["token"]), str(result["status"]["expirationTimestamp"])
