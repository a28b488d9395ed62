"""Every call the node agent (and its test client) makes to the API server.

The only module of the package that imports kr8s. Bodies go in and come out as plain
dicts; kr8s and httpx errors are translated here into `ApiError` and its kinds, so the
rest of the agent speaks one error vocabulary. Every call goes through `_call`: kr8s never
reads a refusal itself (`telemetry.refusal` says why; the agent posts Events into
namespaces that may be going away).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import kr8s
import kr8s.asyncio

from telemetry.refusal import answer
from telemetry.watch import watch_params

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


class Gone(ApiError):
    """The watch's resourceVersion is too old: list again."""


class Forbidden(ApiError):
    pass


_KINDS: Mapping[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone, 403: Forbidden}


def _translate(error: Exception) -> ApiError:
    if isinstance(error, ApiError):
        return error
    return ApiError(0, f"{type(error).__name__}: {error}"[:500])


def _kind_of(status: Mapping[str, Any]) -> ApiError:
    code = int(status.get("code", 0))
    return _KINDS.get(code, ApiError)(code, str(status.get("message", ""))[:500])


class Kube:
    """A thin client over one kr8s `Api` (injected)."""

    def __init__(self, api: Any) -> None:
        self._api = api

    @classmethod
    async def connect(cls, kubeconfig: str) -> Kube:
        return cls(await kr8s.asyncio.api(kubeconfig=kubeconfig))

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
        kwargs: dict[str, Any] = {"timeout": REQUEST_TIMEOUT}
        if params:
            kwargs["params"] = dict(params)
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        try:
            async with self._call(method, version=version, url=url, **kwargs) as response:
                result: Json = response.json() if response.content else {}
                return result
        except (ApiError, kr8s.APITimeoutError, httpx.HTTPError, OSError) as error:
            raise _translate(error) from error

    @contextlib.asynccontextmanager
    async def _call(self, method: str, **kwargs: Any) -> AsyncIterator[Any]:
        """`api.call_api` with kr8s's reading of a refusal turned off: an error status
        raises its ApiError here."""
        async with answer(
            lambda: self._api.call_api(method, raise_for_status=False, **kwargs),
            lambda refused: _KINDS.get(refused.code, ApiError)(refused.code, refused.message),
        ) as response:
            yield response

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
        async for event in self.watch("pods", resource_version, f"spec.nodeName={node}"):
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
        params = watch_params(resource_version, WATCH_SECONDS, field_selector=field_selector)
        try:
            async with self._call(
                "GET", version="v1", url=plural, params=params, stream=True, timeout=WATCH_TIMEOUT
            ) as response:
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        raise _kind_of(event["object"])
                    yield event["type"], event["object"]
        except (ApiError, kr8s.APITimeoutError, httpx.HTTPError, OSError) as error:
            raise _translate(error) from error

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
