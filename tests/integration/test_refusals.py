"""A refused request leaves every other call on the same client alone, against the real API
server, for each of the three programs' kube modules (reconciler, router, node agent).

The refusals are the 403s programs here meet every day: a namespace being deleted refuses
anything new in it, and a Role refuses what it does not grant (a router's RoleBinding
reaches the authorizer a moment after the router starts). kr8s's own reading of a 403
would re-load the credentials and close its HTTP session under every watch in flight
(`kubecore.refusal`): a reconciler that wrote into a test's namespace while it went away
lost its Pod watch, and the swap of another namespace waited out its budget. Each test
opens a watch, has a request refused through the same kr8s client, and proves the watch
still delivers the next change without breaking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kr8s.asyncio
import pytest
import yaml

from e2e.harness import eventually, wait_established
from e2e.local.fixtures import Kubectl, fresh_namespace, kr8s_client
from e2e.local.node_agent import kube as agent_kube
from reconciler import kube as reconciler_kube
from sidecar.kube import KubeClient, KubeError
from sidecar.kube_port import Changed, Listed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
POOL_CRD = ROOT / "manifests" / "crds" / "modelpool.dev_modelpools.yaml"
HOLD = "modelpool.dev/test-hold"  # a finalizer no controller removes: the test does
TERMINATING = "because it is being terminated"


@pytest.fixture
def dying(request: pytest.FixtureRequest, kubectl: Kubectl) -> Iterator[str]:
    """A namespace being deleted, held in Terminating by a finalizer on a ConfigMap and on a
    ModelPool (whose uid a router's Event needs) until the test ends."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(POOL_CRD))
    wait_established(kubectl, ["modelpools.modelpool.dev"])
    with fresh_namespace(kubectl, request.node.nodeid + "-dying") as name:
        held = [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "held", "namespace": name, "finalizers": [HOLD]}},
            {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelPool",
             "metadata": {"name": "heavy", "namespace": name, "finalizers": [HOLD]},
             "spec": {"members": [{"name": "coder"}]}},
        ]
        for body in held:
            kubectl("create", "-f", "-", input=json.dumps(body))
        kubectl("delete", "namespace", name, "--wait=false")
        try:
            yield name
        finally:
            for kind in ("configmap/held", "modelpool.modelpool.dev/heavy"):
                kubectl("patch", "-n", name, kind, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}', check=False)


async def next_change(events: AsyncIterator[tuple[str, dict[str, Any]]]) -> tuple[str, str]:
    """The next event of a raw watch that is not a bookmark: (type, object name)."""
    async with asyncio.timeout(30):
        async for kind, obj in events:
            if kind != "BOOKMARK":
                return kind, obj["metadata"]["name"]
    raise AssertionError("the watch ended")


async def test_the_reconcilers_watch_outlives_a_write_refused_in_a_dying_namespace(
    api: kr8s.asyncio.Api, kubectl: Kubectl, namespace: str, dying: str
) -> None:
    kube = reconciler_kube.Kube(api)
    _, version = await kube.list_all(reconciler_kube.CONFIG_MAPS, namespace)
    events = kube.watch(reconciler_kube.CONFIG_MAPS, namespace, version)
    opened = asyncio.ensure_future(next_change(events))  # the watch's request goes out
    kubectl("create", "configmap", "before", "-n", namespace)
    assert await opened == ("ADDED", "before")

    with pytest.raises(reconciler_kube.KubeError) as refused:
        await kube.apply({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "late", "namespace": dying}})
    assert isinstance(refused.value, reconciler_kube.NamespaceTerminating)
    assert refused.value.status == 403
    assert TERMINATING in str(refused.value)
    assert not refused.value.temporary

    kubectl("create", "configmap", "after", "-n", namespace)
    assert await next_change(events) == ("ADDED", "after")


def router_kubeconfig(kubectl: Kubectl, namespace: str, directory: Path) -> Path:
    """A kubeconfig of the ServiceAccount `chat-router`, whose Role reads its ConfigMap
    and nothing else (a router's Role, less its ModelPool rights)."""
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "chat-router"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "chat-router"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": ["chat-router-config"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "chat-router"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "chat-router"},
         "subjects": [{"kind": "ServiceAccount", "name": "chat-router",
                       "namespace": namespace}]},
    ]
    for body in objects:
        kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    path = directory / "router.kubeconfig"
    write_token_kubeconfig(kubectl, path, router_token(kubectl, namespace))
    return path


def router_token(kubectl: Kubectl, namespace: str, bound_to: str | None = None) -> str:
    """A token of `chat-router`; with `bound_to`, valid only while that Secret exists."""
    bound = ["--bound-object-kind=Secret", f"--bound-object-name={bound_to}"] if bound_to else []
    return str(kubectl("create", "token", "chat-router", "-n", namespace, *bound).stdout.strip())


def write_token_kubeconfig(kubectl: Kubectl, path: Path, token: str) -> None:
    admin = yaml.safe_load(kubectl("config", "view", "--raw", "--minify").stdout)
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "router",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "router", "user": {"token": token}}],
        "contexts": [{"name": "router", "context": {"cluster": "local", "user": "router"}}],
    }
    path.write_text(yaml.safe_dump(config))


async def test_the_routers_watch_outlives_a_read_its_role_refuses(
    kubectl: Kubectl, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    kubectl("create", "configmap", "chat-router-config", "-n", namespace,
            "--from-literal=config.json={}")
    async with kr8s_client(router_kubeconfig(kubectl, namespace, tmp_path)) as api:
        client = KubeClient(api)
        events = client.watch_config_map(namespace, "chat-router-config")
        async with contextlib.aclosing(events):  # the loop never ends on its own
            async with asyncio.timeout(30):
                listed = await anext(events)
            assert isinstance(listed, Listed)
            changed = asyncio.ensure_future(anext(events))  # the watch's request goes out
            patch_config(kubectl, namespace, "first")
            async with asyncio.timeout(30):
                assert isinstance(await changed, Changed)

            caplog.set_level(logging.WARNING, logger="sidecar.kube")
            with pytest.raises(KubeError, match=r"HTTP 403: .*cannot get resource"):
                await client.get_pool(namespace, "heavy")

            patch_config(kubectl, namespace, "second")
            async with asyncio.timeout(30):
                second = await anext(events)
            assert isinstance(second, Changed)
            assert second.item.data == {"config.json": '{"second": true}'}
            # Delivered on the connection the watch had: it never broke and resumed.
            assert [r.getMessage() for r in caplog.records if r.name == "sidecar.kube"] == []


def patch_config(kubectl: Kubectl, namespace: str, key: str) -> None:
    data = {"data": {"config.json": json.dumps({key: True})}}
    kubectl("patch", "configmap", "chat-router-config", "-n", namespace, "--type=merge",
            "-p", json.dumps(data))


async def test_the_node_agents_watch_outlives_an_event_refused_in_a_dying_namespace(
    api: kr8s.asyncio.Api, kubectl: Kubectl, namespace: str, dying: str
) -> None:
    kube = agent_kube.Kube(api)
    result = await kube.request("GET", "v1", f"namespaces/{namespace}/configmaps")
    version = str(result["metadata"]["resourceVersion"])
    events = kube.watch(f"namespaces/{namespace}/configmaps", version)
    opened = asyncio.ensure_future(next_change(events))  # the watch's request goes out
    kubectl("create", "configmap", "before", "-n", namespace)
    assert await opened == ("ADDED", "before")

    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "held."},
             "involvedObject": {"kind": "ConfigMap", "name": "held", "namespace": dying},
             "reason": "Test", "message": "refused", "type": "Normal"}
    with pytest.raises(agent_kube.Forbidden, match=TERMINATING):
        await kube.create_event(dying, event)

    kubectl("create", "configmap", "after", "-n", namespace)
    assert await next_change(events) == ("ADDED", "after")


async def test_a_router_whose_token_is_revoked_reads_the_new_one_and_keeps_its_watch(
    kubectl: Kubectl, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A 401 (the token on the session is no longer valid: rotated, or its object gone)
    reads the credentials again and sets them on the same session: the request goes again
    and succeeds, and the watch that was open stays open."""
    kubectl("create", "configmap", "chat-router-config", "-n", namespace,
            "--from-literal=config.json={}")
    path = router_kubeconfig(kubectl, namespace, tmp_path)
    kubectl("create", "secret", "generic", "holder", "-n", namespace)
    write_token_kubeconfig(kubectl, path, router_token(kubectl, namespace, bound_to="holder"))
    async with kr8s_client(path) as api:
        client = KubeClient(api)
        events = client.watch_config_map(namespace, "chat-router-config")
        async with contextlib.aclosing(events):
            async with asyncio.timeout(30):
                assert isinstance(await anext(events), Listed)
            changed = asyncio.ensure_future(anext(events))  # the watch's request goes out
            patch_config(kubectl, namespace, "first")
            async with asyncio.timeout(30):
                assert isinstance(await changed, Changed)

            # The token on the session dies with its Secret; the file gets a new one.
            old = router_token_in(path)
            kubectl("delete", "secret", "holder", "-n", namespace)
            wait_unauthorized(kubectl, namespace, old, tmp_path)
            write_token_kubeconfig(kubectl, path, router_token(kubectl, namespace))
            caplog.set_level(logging.INFO, logger="kubecore.refusal")
            caplog.set_level(logging.INFO, logger="sidecar.kube")
            with pytest.raises(KubeError, match=r"HTTP 403: .*cannot get resource"):
                await client.get_pool(namespace, "heavy")  # authenticated again: now refused
            assert [r.getMessage() for r in caplog.records] == [
                "the API server answered 401: reading the credentials again"]

            patch_config(kubectl, namespace, "second")
            async with asyncio.timeout(30):
                second = await anext(events)
            assert isinstance(second, Changed)
            assert second.item.data == {"config.json": '{"second": true}'}
            assert len(caplog.records) == 1  # the watch never broke


def router_token_in(path: Path) -> str:
    return str(yaml.safe_load(path.read_text())["users"][0]["user"]["token"])


def wait_unauthorized(kubectl: Kubectl, namespace: str, token: str, directory: Path) -> None:
    """Until the API server answers `token` 401 (it caches a token's review for seconds)."""
    path = directory / "revoked.kubeconfig"
    write_token_kubeconfig(kubectl, path, token)
    revoked = Kubectl(path, kubectl.binary)

    def refused() -> bool | None:
        result = revoked("get", "configmap", "chat-router-config", "-n", namespace,
                         check=False)
        return True if "Unauthorized" in result.stderr else None

    eventually(refused, "the API server refusing the revoked token", 60)
