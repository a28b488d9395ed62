"""The testbed keeps Kubernetes' promises (issue 2's acceptance list).

Against the local cluster: the real scheduler counts fake GPUs, the node agent runs pods
as processes on their own loopback addresses, the EndpointSlice controller publishes
only ready pods, RBAC applies to a pod's own token, garbage collection follows owner
references, and an image that nothing stands in for fails its pod loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import kr8s.asyncio
import openai
import pytest
from kr8s.asyncio.objects import object_from_spec

from e2e.local import certs
from e2e.local.controlplane import LocalCluster
from e2e.local.fixtures import Kubectl
from e2e.local.kubeconfig import render as render_kubeconfig
from e2e.local.kubeconfig import write as write_kubeconfig

pytestmark = pytest.mark.integration

Json = dict[str, Any]
T = TypeVar("T")

FAKE_MODEL_IMAGE = "ghcr.io/modelpool/fake-model:test"
TESTBED_CLIENT_IMAGE = "modelpool/testbed-client"
MODEL_PORT = 8080


async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str, within: float = 60.0
) -> T:
    """Poll `check` until it returns something other than None."""
    try:
        async with asyncio.timeout(within):
            while True:
                result = await check()
                if result is not None:
                    return result
                await asyncio.sleep(0.25)
    except TimeoutError:
        raise AssertionError(f"timed out after {within}s waiting for {what}") from None


async def create(api: kr8s.asyncio.Api, namespace: str, manifest: Json) -> Json:
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    obj = await object_from_spec(manifest, api=api)
    await obj.create()
    return dict(obj.raw)


async def get_all(api: kr8s.asyncio.Api, kind: str, namespace: str, **selectors: Any) -> list[Json]:
    return [dict(o) async for o in api.get(kind, namespace=namespace, raw=True, **selectors)]


async def get_one(api: kr8s.asyncio.Api, kind: str, namespace: str, name: str) -> Json | None:
    found = await get_all(api, kind, namespace, field_selector=f"metadata.name={name}")
    return found[0] if found else None


def pod_ready(pod: Json) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def unschedulable_message(pod: Json) -> str | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message", ""))
    return None


# --- the GPU lock, seen from outside --------------------------------------------------


def lock_holders(lock_file: Path) -> set[int]:
    """Pids holding a flock on `lock_file`, from /proc/locks (taking nothing ourselves)."""
    try:
        inode = os.stat(lock_file).st_ino
    except FileNotFoundError:
        return set()
    holders: set[int] = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if int(fields[5].rsplit(":", 1)[1]) == inode:
            holders.add(int(fields[4]))
    return holders


def lock_is_held(lock_file: Path) -> bool:
    """Try the lock as a second server would: held means we cannot take it."""
    with lock_file.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


class LockSampler:
    """Samples the holders of a GPU lock every few milliseconds in a thread."""

    def __init__(self, lock_file: Path, period: float = 0.01) -> None:
        self.lock_file = lock_file
        self.period = period
        self.samples = 0
        self.held_samples = 0
        self.most_holders = 0
        self.holders_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-lock-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            holders = lock_holders(self.lock_file)
            self.samples += 1
            self.held_samples += bool(holders)
            self.most_holders = max(self.most_holders, len(holders))
            self.holders_seen |= holders
            self._stop.wait(self.period)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class RunningPodSampler:
    """Counts, from the API, the pods of one app in phase Running, several times a second.

    A terminating pod is still Running (its process still holds the GPU), so this is the
    scheduler's and the node agent's promise: never two GPU pods on one GPU.
    """

    def __init__(self, api: kr8s.asyncio.Api, namespace: str, app: str) -> None:
        self.api = api
        self.namespace = namespace
        self.app = app
        self.samples = 0
        self.most_running = 0

    async def run(self) -> None:
        while True:
            pods = await get_all(self.api, "pods", self.namespace, label_selector={"app": self.app})
            running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
            self.samples += 1
            self.most_running = max(self.most_running, len(running))
            await asyncio.sleep(0.1)


# --- manifests -------------------------------------------------------------------------


def fake_model_deployment(name: str, replicas: int) -> Json:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {
                            "name": "model",
                            "image": FAKE_MODEL_IMAGE,
                            "args": ["--model", "/models/tiny.gguf", "--port", str(MODEL_PORT)],
                            "ports": [{"name": "http", "containerPort": MODEL_PORT}],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": MODEL_PORT},
                                "periodSeconds": 1,
                            },
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def service(name: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": MODEL_PORT, "targetPort": MODEL_PORT}],
        },
    }


async def answers_openai(ip: str) -> str:
    """A chat completion from the server on `ip`; returns the model id it served."""
    async with openai.AsyncOpenAI(
        base_url=f"http://{ip}:{MODEL_PORT}/v1", api_key="unused", max_retries=0, timeout=10
    ) as client:
        models = await client.models.list()
        model = models.data[0].id
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
    assert reply.choices[0].message.content
    return model


async def slice_addresses(api: kr8s.asyncio.Api, namespace: str, svc: str) -> dict[str, bool]:
    """Every address in the Service's EndpointSlices, with its `ready` condition."""
    addresses: dict[str, bool] = {}
    selector = {"kubernetes.io/service-name": svc}
    for s in await get_all(api, "endpointslices", namespace, label_selector=selector):
        for endpoint in s.get("endpoints") or []:
            ready = bool((endpoint.get("conditions") or {}).get("ready"))
            for address in endpoint["addresses"]:
                addresses[address] = ready
    return addresses


# --- the tests -------------------------------------------------------------------------


async def test_one_gpu_runs_one_of_two_gpu_replicas_and_hands_over_on_deletion(
    api: kr8s.asyncio.Api, namespace: str, cluster: LocalCluster
) -> None:
    name = "gpu-model"
    lock_file = cluster.node_state_dir / "gpus" / "gpu0.lock"

    async def one_ready_one_pending(exclude: frozenset[str] = frozenset()) -> Any:
        pods = [
            p
            for p in await get_all(api, "pods", namespace, label_selector={"app": name})
            if p["metadata"]["name"] not in exclude and "deletionTimestamp" not in p["metadata"]
        ]
        ready = [p for p in pods if pod_ready(p) and p["status"].get("podIP")]
        pending = [
            p
            for p in pods
            if p["status"].get("phase") == "Pending"
            and "Insufficient nvidia.com/gpu" in (unschedulable_message(p) or "")
        ]
        if len(pods) == 2 and len(ready) == 1 and len(pending) == 1:
            return ready[0], pending[0]
        return None

    async def endpoints_are_exactly(ip: str) -> Any:
        addresses = await slice_addresses(api, namespace, name)
        return True if addresses == {ip: True} else None

    pod_sampler = RunningPodSampler(api, namespace, name)
    sampling = asyncio.create_task(pod_sampler.run())
    try:
        with LockSampler(lock_file) as sampler:
            await create(api, namespace, service(name))
            await create(api, namespace, fake_model_deployment(name, replicas=2))
            first, pending = await eventually(
                one_ready_one_pending, "one Ready and one Pending pod", 90
            )
            first_ip = first["status"]["podIP"]
            assert first_ip.startswith("127.") and first_ip != "127.0.0.1"
            assert first["spec"]["nodeName"] == cluster.settings.node_name
            assert "nodeName" not in pending["spec"]
            assert await answers_openai(first_ip) == "tiny"
            assert await asyncio.to_thread(lock_is_held, lock_file)
            await eventually(lambda: endpoints_are_exactly(first_ip), "the slice to list the pod")

            pod = await object_from_spec({**first, "kind": "Pod", "apiVersion": "v1"}, api=api)
            await pod.delete()
            gone = frozenset({first["metadata"]["name"]})
            second, _ = await eventually(
                lambda: one_ready_one_pending(exclude=gone), "another pod to take the GPU", 90
            )
            second_ip = second["status"]["podIP"]
            assert second["metadata"]["name"] != first["metadata"]["name"]
            assert await answers_openai(second_ip) == "tiny"
            await eventually(lambda: endpoints_are_exactly(second_ip), "the slice to follow")
    finally:
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling

    assert sampler.samples > 100
    assert sampler.held_samples > 0, "the sampler never saw the GPU lock held"
    assert sampler.most_holders == 1, "two servers held the GPU lock at once"
    assert len(sampler.holders_seen) >= 2, "the lock never passed to the second server"
    assert pod_sampler.samples > 10
    assert pod_sampler.most_running == 1, "two GPU pods were Running at once"


async def test_a_pod_process_has_exactly_its_service_accounts_rights(
    api: kr8s.asyncio.Api, namespace: str, cluster: LocalCluster
) -> None:
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}}
    await create(api, namespace, account)
    await create(
        api,
        namespace,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-lister"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    await create(
        api,
        namespace,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader-lists-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-lister",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    await create(
        api, namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hidden"}}
    )
    pod = await create(
        api,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "rbac-probe"},
            "spec": {
                "serviceAccountName": "reader",
                "restartPolicy": "Never",
                "containers": [
                    {"name": "pods", "image": TESTBED_CLIENT_IMAGE, "args": ["list", "pods"]},
                    {"name": "secrets", "image": TESTBED_CLIENT_IMAGE, "args": ["list", "secrets"]},
                ],
            },
        },
    )

    async def finished() -> Json | None:
        current = await get_one(api, "pods", namespace, "rbac-probe")
        phase = (current or {}).get("status", {}).get("phase")
        return current if phase in ("Succeeded", "Failed") else None

    done = await eventually(finished, "the probe pod to finish")
    exits = {
        s["name"]: s["state"].get("terminated", {}).get("exitCode")
        for s in done["status"]["containerStatuses"]
    }
    assert exits == {"pods": 0, "secrets": 1}
    logs = cluster.node_state_dir / "pods" / f"{namespace}_rbac-probe_{pod['metadata']['uid']}"
    assert (await asyncio.to_thread((logs / "pods.log").read_text)).split()[0] == "OK"
    assert "FORBIDDEN" in await asyncio.to_thread((logs / "secrets.log").read_text)


async def test_deleting_an_owner_collects_its_dependents(
    api: kr8s.asyncio.Api, namespace: str
) -> None:
    owner = await create(
        api,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}, "data": {}},
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    for i in range(2):
        await create(
            api,
            namespace,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"dependent-{i}", "ownerReferences": [reference]},
            },
        )
    bystander = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bystander"}}
    await create(api, namespace, bystander)

    owner_obj = await object_from_spec({**owner, "kind": "ConfigMap", "apiVersion": "v1"}, api=api)
    await owner_obj.delete(propagation_policy="Background")

    async def collected() -> bool | None:
        names = {c["metadata"]["name"] for c in await get_all(api, "configmaps", namespace)}
        return True if not names & {"owner", "dependent-0", "dependent-1"} else None

    await eventually(collected, "the dependents to be garbage-collected")
    assert await get_one(api, "configmaps", namespace, "bystander") is not None


async def test_an_unknown_image_fails_its_pod_with_a_reason_naming_it(
    api: kr8s.asyncio.Api, namespace: str
) -> None:
    image = "registry.example/nobody/no-such-model:1.0"
    await create(
        api,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "unknown"},
            "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": image}]},
        },
    )

    async def failed() -> Json | None:
        pod = await get_one(api, "pods", namespace, "unknown")
        return pod if (pod or {}).get("status", {}).get("phase") == "Failed" else None

    pod = await eventually(failed, "the pod to fail")
    status = pod["status"]
    waiting = status["containerStatuses"][0]["state"].get("waiting", {})
    assert "nobody/no-such-model" in status.get("message", "") + waiting.get("message", "")
    assert status.get("reason") or waiting.get("reason")



async def test_pod_security_admission_refuses_a_pod_on_the_host_network(
    api: kr8s.asyncio.Api, namespace: str
) -> None:
    """The test namespaces enforce the `baseline` level: host namespaces are refused."""
    on_host = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "on-host"},
        "spec": {
            "hostNetwork": True,
            "containers": [{"name": "c", "image": FAKE_MODEL_IMAGE}],
        },
    }
    with pytest.raises(kr8s.ServerError) as refused:
        await create(api, namespace, on_host)
    assert refused.value.response is not None
    assert refused.value.response.status_code == 403
    assert "violates PodSecurity" in str(refused.value)


def test_a_node_identity_is_held_by_node_authorization_and_node_restriction(
    cluster: LocalCluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """A kubelet's credentials (user `system:node:<name>`): only the Node authorizer
    lets them read their Node (RBAC binds nothing to `system:nodes`); they may not list
    Secrets; NodeRestriction refuses them a `node-restriction.kubernetes.io/` label."""
    layout = cluster.layout
    ca = certs.Issued(layout.cert("ca").read_bytes(), layout.key("ca").read_bytes())
    node_name = cluster.settings.node_name
    identity = certs.Identity(f"system:node:{node_name}", organizations=("system:nodes",))
    issued = certs.issue(ca, identity, dt.datetime.now(dt.UTC))
    node_config = tmp_path / "node.kubeconfig"
    text = render_kubeconfig(
        cluster.settings.server, ca.cert_pem, identity.common_name, issued.cert_pem, issued.key_pem
    )
    write_kubeconfig(node_config, text)
    as_node = Kubectl(node_config, kubectl.binary)

    assert as_node("get", "node", node_name, "-o", "name").stdout.strip() == f"node/{node_name}"
    secrets = as_node("get", "secrets", "-n", namespace, check=False)
    assert secrets.returncode != 0 and "forbidden" in secrets.stderr.lower()
    label = as_node(
        "label", "node", node_name, "node-restriction.kubernetes.io/pool=x", check=False
    )
    assert label.returncode != 0 and "forbidden" in label.stderr.lower()
