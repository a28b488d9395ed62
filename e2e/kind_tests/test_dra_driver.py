"""The fake GPUs' Dynamic Resource Allocation driver (e2e/dra_driver) on its own kind
cluster (e2e/kind/up-dra.sh: one node labelled with two fake GPUs of 1024 MiB, containerd
2.x for CDI): it publishes the devices with their memory, prepares a claim's device for the
containers that reference it (the device's environment and the node's ledger, mounted),
several pods that share one claim charge one ledger and the one that would overcommit the
device fails, it unprepares when the pods are gone, and it is found again after the
kubelet restarts.

The main kind cluster has no DRA driver (its containerd, Debian's 1.6, has no CDI): these
tests run only when `MODELPOOL_KIND_DRA=1` says that MODELPOOL_KIND_KUBECONFIG names the
DRA cluster; otherwise they are not even collected (e2e/kind_tests/conftest.py), so the
test command (CI) does not run them:

    MODELPOOL_KIND_KUBECONFIG=$(e2e/kind/up-dra.sh | tail -n 1) MODELPOOL_KIND_DRA=1 \\
      .venv/bin/pytest e2e/kind_tests/test_dra_driver.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e import harness
from e2e.fake_model.gpu_ledger import live_charges
from e2e.local.fixtures import Kubectl

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.environ.get("MODELPOOL_KIND_DRA") != "1",
                       reason="needs the DRA kind cluster (e2e/kind/up-dra.sh) and "
                              "MODELPOOL_KIND_DRA=1"),
]

DRIVER = "gpu.fake.modelpool.dev"
DAEMONSET = "modelpool-fake-gpu-dra"
MEMORY_LABEL = "modelpool.dev/fake-gpu-memory-mib"
COUNT_LABEL = "modelpool.dev/fake-gpus"
MIB = 1 << 20
# on the node: the ledgers and the CDI specs the driver writes
LEDGER_DIR = "lib/modelpool-fake-gpu/locks"  # under the node's /var
CDI_DIR = "/var/run/cdi"
CONTAINER_LOCK_DIR = "/run/modelpool-gpu-locks"
LLAMA_IMAGE = "modelpool/llama-server:e2e"  # the real llama-server (e2e/kind/README.md)


@pytest.fixture(scope="module")
def gpu_node(kind_kubectl: Kubectl) -> dict[str, Any]:
    """The DRA cluster's node with fake GPUs (a kind node's name is its container's)."""
    nodes = kind_kubectl.json("get", "nodes", "-l", MEMORY_LABEL)["items"]
    assert nodes, f"no node labelled {MEMORY_LABEL}: is this the DRA cluster (up-dra.sh)?"
    node: dict[str, Any] = nodes[0]
    return node


def node_name(node: dict[str, Any]) -> str:
    return str(node["metadata"]["name"])


def node_exec(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", node, *argv], capture_output=True, text=True,
                          timeout=60, check=False)


def ledger_dir(node: str) -> Path:
    """The node's ledger directory as this machine sees it: kind keeps a node's /var in a
    Docker volume, so the ledger's charges and /proc/locks are read from here."""
    var = subprocess.run(
        ["docker", "inspect", "-f",
         '{{range .Mounts}}{{if eq .Destination "/var"}}{{.Source}}{{end}}{{end}}', node],
        capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    assert var, f"node {node} keeps no /var volume"
    return Path(var) / LEDGER_DIR


def charged(node: str, index: str, count: int) -> list[int]:
    """The bytes charged to device `index` of the node once `count` servers hold a charge
    (a container is running before its server has charged the ledger)."""
    def read() -> list[int] | None:
        found = sorted(c.bytes for c in live_charges(ledger_dir(node), index))
        return found if len(found) == count else None
    return harness.eventually(read, f"{count} live charges on GPU {index} of {node}", 60,
                              lambda: live_charges(ledger_dir(node), index))


def plugin_pod(kubectl: Kubectl, node: str) -> Any:
    pods = kubectl.json("get", "pods", "-n", "kube-system", "-l",
                        f"app.kubernetes.io/name={DAEMONSET}",
                        "--field-selector", f"spec.nodeName={node}")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    return running[0] if running else None


def claim(name: str) -> harness.Json:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}


def server(name: str, claim_name: str, footprint_mib: int,
           image: str = harness.FAKE_MODEL_IMAGE,
           args: tuple[str, ...] | None = None) -> harness.Json:
    """A fake model server (or `image` with `args`), Pod Security `restricted`, on the
    claim's device, charging `footprint_mib` to its ledger; not restarted when it fails."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [{
                "name": "server", "image": image,
                "imagePullPolicy": "Never",
                "args": list(args or ("--mode", "openai", "--model", name)),
                "env": [{"name": "MODELPOOL_GPU_FOOTPRINT",
                         "value": str(footprint_mib * MIB)}],
                "resources": {"claims": [{"name": "gpu"}]},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def create(kubectl: Kubectl, namespace: str, *objects: harness.Json) -> None:
    kubectl("create", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def pod(kubectl: Kubectl, namespace: str, name: str) -> Any:
    return kubectl.json("get", "pod", name, "-n", namespace)


def running(kubectl: Kubectl, namespace: str, name: str) -> Any:
    obj = pod(kubectl, namespace, name)
    statuses = obj["status"].get("containerStatuses") or []
    return obj if statuses and statuses[0].get("ready") else None


def terminated(kubectl: Kubectl, namespace: str, name: str) -> Any:
    statuses = pod(kubectl, namespace, name)["status"].get("containerStatuses") or []
    return statuses[0]["state"].get("terminated") if statuses else None


def container_env(kubectl: Kubectl, namespace: str, name: str) -> dict[str, str]:
    out = kubectl("exec", "-n", namespace, name, "--", "env").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def claim_uid(kubectl: Kubectl, namespace: str, name: str) -> str:
    return str(kubectl.json("get", "resourceclaim", name, "-n", namespace)["metadata"]["uid"])


def cdi_spec(node: str, uid: str) -> str | None:
    """The CDI spec the driver wrote for the claim `uid` on the node, None if there is none."""
    found = node_exec(node, "sh", "-c", f"cat {CDI_DIR}/*_{uid}.json")
    return found.stdout if found.returncode == 0 else None


def delete_pods(kubectl: Kubectl, namespace: str, *names: str) -> None:
    kubectl("delete", "pod", "-n", namespace, *names, "--wait=true", timeout=120)


def binary_bytes(quantity: str) -> int:
    """A quantity as the API server writes a power-of-two amount of bytes: 1Gi, 512Mi."""
    for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti"), start=1):
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) << (10 * power)
    return int(quantity)


def test_each_device_is_published_with_its_memory(
    kind_kubectl: Kubectl, gpu_node: dict[str, Any],
) -> None:
    name = node_name(gpu_node)
    labels = gpu_node["metadata"]["labels"]
    slices = [s for s in kind_kubectl.json("get", "resourceslices")["items"]
              if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == name]
    assert len(slices) == 1, slices
    spec = slices[0]["spec"]
    assert spec["pool"]["name"] == name
    devices = {d["name"]: d for d in spec["devices"]}
    assert sorted(devices) == [f"gpu-{i}" for i in range(int(labels[COUNT_LABEL]))]
    for i, device in enumerate(sorted(devices)):
        assert devices[device]["attributes"]["index"] == {"int": i}
        memory = devices[device]["capacity"]["memory"]["value"]
        assert binary_bytes(memory) == int(labels[MEMORY_LABEL]) * MIB, memory
    device_class = kind_kubectl.json("get", "deviceclass", DRIVER)
    assert DRIVER in device_class["spec"]["selectors"][0]["cel"]["expression"]


def test_a_claim_is_prepared_for_its_pod_and_unprepared_when_the_pod_goes(
    kind_kubectl: Kubectl, restricted_namespace: str, gpu_node: dict[str, Any],
) -> None:
    ns, node = restricted_namespace, node_name(gpu_node)
    create(kind_kubectl, ns, claim("one"), server("solo", "one", 100))
    harness.eventually(lambda: running(kind_kubectl, ns, "solo"), "pod solo to run", 120)
    allocated = kind_kubectl.json("get", "resourceclaim", "one", "-n", ns)["status"]
    result = allocated["allocation"]["devices"]["results"][0]
    assert (result["driver"], result["pool"]) == (DRIVER, node)
    index = result["device"].removeprefix("gpu-")

    env = container_env(kind_kubectl, ns, "solo")
    memory = int(gpu_node["metadata"]["labels"][MEMORY_LABEL]) * MIB
    assert env["NVIDIA_VISIBLE_DEVICES"] == index
    assert env["MODELPOOL_GPU_MEMORY"] == str(memory)
    assert env["MODELPOOL_GPU_LOCK_DIR"] == CONTAINER_LOCK_DIR
    mounts = kind_kubectl("exec", "-n", ns, "solo", "--", "cat", "/proc/mounts").stdout
    assert f" {CONTAINER_LOCK_DIR} " in mounts, mounts
    # the server charged the node's ledger through the mount
    assert charged(node, index, 1) == [100 * MIB]

    uid = claim_uid(kind_kubectl, ns, "one")
    spec = cdi_spec(node, uid)
    assert spec is not None and f"NVIDIA_VISIBLE_DEVICES={index}" in spec
    delete_pods(kind_kubectl, ns, "solo")
    harness.eventually(lambda: True if cdi_spec(node, uid) is None else None,
                       "the claim's CDI spec to be removed once its pod is gone", 60)
    assert live_charges(ledger_dir(node), index) == []


def test_pods_that_share_a_claim_share_its_device_and_its_ledger(
    kind_kubectl: Kubectl, restricted_namespace: str, gpu_node: dict[str, Any],
) -> None:
    ns, node = restricted_namespace, node_name(gpu_node)
    memory_mib = int(gpu_node["metadata"]["labels"][MEMORY_LABEL])
    footprint = memory_mib * 4 // 10  # two fit, three do not
    create(kind_kubectl, ns, claim("shared"), server("a", "shared", footprint),
           server("b", "shared", footprint))
    harness.eventually(lambda: running(kind_kubectl, ns, "a"), "pod a to run", 120)
    harness.eventually(lambda: running(kind_kubectl, ns, "b"), "pod b to run", 120)
    status = kind_kubectl.json("get", "resourceclaim", "shared", "-n", ns)["status"]
    assert sorted(r["name"] for r in status["reservedFor"]) == ["a", "b"]
    devices = {container_env(kind_kubectl, ns, n)["NVIDIA_VISIBLE_DEVICES"] for n in "ab"}
    assert len(devices) == 1, devices
    index = devices.pop()
    assert charged(node, index, 2) == [footprint * MIB] * 2

    # a third on the same device passes its memory: it fails loudly, as CUDA would
    create(kind_kubectl, ns, server("c", "shared", footprint))
    ended = harness.eventually(lambda: terminated(kind_kubectl, ns, "c"),
                               "pod c to fail on the full device", 120)
    assert ended["exitCode"] == 3, ended
    logs = kind_kubectl("logs", "-n", ns, "c").stdout
    assert f"GPU {index} out of memory" in logs, logs
    assert len(live_charges(ledger_dir(node), index)) == 2
    assert running(kind_kubectl, ns, "a") and running(kind_kubectl, ns, "b")

    # one server gone frees its charge; the claim stays prepared for the other
    uid = claim_uid(kind_kubectl, ns, "shared")
    delete_pods(kind_kubectl, ns, "a")
    assert [c.bytes for c in live_charges(ledger_dir(node), index)] == [footprint * MIB]
    assert cdi_spec(node, uid) is not None
    delete_pods(kind_kubectl, ns, "b", "c")
    harness.eventually(lambda: True if cdi_spec(node, uid) is None else None,
                       "the shared claim's CDI spec to be removed once its pods are gone", 60)


def test_after_a_kubelet_restart_the_driver_is_found_again(
    kind_kubectl: Kubectl, restricted_namespace: str, gpu_node: dict[str, Any],
) -> None:
    ns, node = restricted_namespace, node_name(gpu_node)
    plugin = plugin_pod(kind_kubectl, node)
    assert plugin is not None
    create(kind_kubectl, ns, claim("before"), server("before", "before", 100))
    harness.eventually(lambda: running(kind_kubectl, ns, "before"), "pod before to run", 120)

    subprocess.run(["docker", "exec", node, "systemctl", "restart", "kubelet"], check=True,
                   timeout=60)
    harness.eventually(
        lambda: True if node_exec(node, "systemctl", "is-active", "kubelet").stdout.strip()
        == "active" else None, "the kubelet to be active again", 60)

    # the kubelet forgot its plugins as it stopped: it can prepare a new claim only once it
    # has found the driver's registration socket again
    create(kind_kubectl, ns, claim("after"), server("after", "after", 100))
    harness.eventually(lambda: running(kind_kubectl, ns, "after"),
                       "a pod with a new claim to run after the kubelet restarted", 180)
    assert container_env(kind_kubectl, ns, "after")["MODELPOOL_GPU_LOCK_DIR"] == \
        CONTAINER_LOCK_DIR
    assert cdi_spec(node, claim_uid(kind_kubectl, ns, "after")) is not None
    # the same driver process served it, and the pod of before kept its device
    again = plugin_pod(kind_kubectl, node)
    assert again is not None and again["metadata"]["uid"] == plugin["metadata"]["uid"]
    assert again["status"]["containerStatuses"][0]["restartCount"] == \
        plugin["status"]["containerStatuses"][0]["restartCount"]
    assert running(kind_kubectl, ns, "before")
    delete_pods(kind_kubectl, ns, "before", "after")


@pytest.mark.build("llama-server")
def test_a_real_llama_server_charges_the_claimed_device_beside_a_fake_one(
    kind_kubectl: Kubectl, restricted_namespace: str, gpu_node: dict[str, Any],
) -> None:
    ns, node = restricted_namespace, node_name(gpu_node)
    footprint = int(gpu_node["metadata"]["labels"][MEMORY_LABEL]) * 4 // 10
    llama_args = ("-m", "/models/beta.gguf", "--host", "0.0.0.0", "--port", "8080")
    create(kind_kubectl, ns, claim("mixed"), server("fake", "mixed", footprint),
           server("llama", "mixed", footprint, LLAMA_IMAGE, llama_args))
    harness.eventually(lambda: running(kind_kubectl, ns, "fake"), "pod fake to run", 120)
    harness.eventually(lambda: running(kind_kubectl, ns, "llama"), "pod llama to run", 120)
    index = container_env(kind_kubectl, ns, "llama")["NVIDIA_VISIBLE_DEVICES"]
    assert charged(node, index, 2) == [footprint * MIB] * 2
    # a second real server would pass the device's memory: it never starts
    create(kind_kubectl, ns, server("llama2", "mixed", footprint, LLAMA_IMAGE, llama_args))
    ended = harness.eventually(lambda: terminated(kind_kubectl, ns, "llama2"),
                               "pod llama2 to fail on the full device", 120)
    assert ended["exitCode"] == 3, ended
    assert f"GPU {index} out of memory" in kind_kubectl("logs", "-n", ns, "llama2").stdout
    delete_pods(kind_kubectl, ns, "fake", "llama", "llama2")
    assert live_charges(ledger_dir(node), index) == []
