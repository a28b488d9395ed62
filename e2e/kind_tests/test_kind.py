"""modelpool on kind, judged by a real kubelet: the nodes, the fake GPU device plugin, and
a pool whose two members fit on one node's two GPUs yet never run together, served through
a router on a node without GPUs, in namespaces that enforce Pod Security `restricted`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from e2e import harness, testbeds
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

CLUSTER = testbeds.kind_cluster()
ONE_GPU, TWO_GPUS = f"{CLUSTER}-worker", f"{CLUSTER}-worker2"
CONTROL_PLANE = f"{CLUSTER}-control-plane"
PLUGIN = "modelpool-fake-gpu-plugin"


def allocatable(kubectl: Kubectl, node: str) -> str | None:
    obj = kubectl.json("get", "node", node)
    value = (obj["status"].get("allocatable") or {}).get("nvidia.com/gpu")
    return None if value is None else str(value)


def plugin_pod(kubectl: Kubectl, node: str) -> Any:
    pods = kubectl.json("get", "pods", "-n", "kube-system", "-l",
                        f"app.kubernetes.io/name={PLUGIN}",
                        "--field-selector", f"spec.nodeName={node}")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    return running[0] if running else None


def test_nodes_run_containerd_and_the_kubelet_of_the_release(kind_kubectl: Kubectl) -> None:
    nodes = kind_kubectl.json("get", "nodes")["items"]
    assert {n["metadata"]["name"] for n in nodes} == {CONTROL_PLANE, ONE_GPU, TWO_GPUS}
    for node in nodes:
        info = node["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://"), info
        assert info["kubeletVersion"].startswith("v1.35."), info
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", node["metadata"]["name"]


def test_the_plugin_advertises_each_nodes_gpus_and_they_go_with_it(
    kind_kubectl: Kubectl,
) -> None:
    assert allocatable(kind_kubectl, ONE_GPU) == "1"
    assert allocatable(kind_kubectl, TWO_GPUS) == "2"
    assert allocatable(kind_kubectl, CONTROL_PLANE) is None
    old = plugin_pod(kind_kubectl, TWO_GPUS)
    assert old is not None
    # Without the label the DaemonSet takes its pod off the node (a deleted pod would be
    # replaced within a second, before the node's status shows the gap).
    kind_kubectl("label", "node", TWO_GPUS, "modelpool.dev/fake-gpus-")
    try:
        harness.eventually(lambda: True if plugin_pod(kind_kubectl, TWO_GPUS) is None else None,
              "the plugin's pod to leave the 2-GPU node", 60)
        # The kubelet drops a plugin's devices from allocatable when its stream ends.
        harness.eventually(lambda: True if allocatable(kind_kubectl, TWO_GPUS) == "0" else None,
              "allocatable nvidia.com/gpu to drop to 0 on the 2-GPU node", 60)
    finally:
        kind_kubectl("label", "node", TWO_GPUS, "modelpool.dev/fake-gpus=2", "--overwrite")
    harness.eventually(lambda: True if allocatable(kind_kubectl, TWO_GPUS) == "2" else None,
          "the plugin's new pod to register 2 GPUs again", 120)
    new = plugin_pod(kind_kubectl, TWO_GPUS)
    assert new is not None and new["metadata"]["uid"] != old["metadata"]["uid"]


def test_a_kubelet_restart_is_followed_by_a_new_registration(kind_kubectl: Kubectl) -> None:
    pod = plugin_pod(kind_kubectl, ONE_GPU)
    assert pod is not None
    name = pod["metadata"]["name"]

    def registrations() -> int:
        # the kubelet serves the logs: while it restarts, they cannot be read
        logs = kind_kubectl("logs", "-n", "kube-system", name, check=False)
        return logs.stdout.count("registered nvidia.com/gpu with the kubelet")

    before = registrations()
    assert before >= 1
    subprocess.run(["docker", "exec", ONE_GPU, "systemctl", "restart", "kubelet"], check=True,
                   timeout=60)
    # The kubelet removes the plugins' sockets as it starts; the plugin sees its own go.
    harness.eventually(lambda: True if registrations() > before else None,
          "the plugin to register again after the kubelet restarted", 120)
    harness.eventually(lambda: True if allocatable(kind_kubectl, ONE_GPU) == "1" else None,
          "the node to advertise its GPU again", 120)


def member(name: str, node: str, unload_time: float = 0.0,
           image: str = harness.FAKE_MODEL_IMAGE, scratch: bool = True) -> harness.Json:
    return harness.on_node(harness.fake_member(name, load_time=1.0, env={
        "FAKE_MODEL_UNLOAD_TIME": str(unload_time)} if unload_time else None, image=image,
        scratch=scratch), node)


def router_on_control_plane(name: str, backends: list[str]) -> harness.Json:
    return harness.router_on_node(harness.router(name, backends), CONTROL_PLANE)


def member_pods(kubectl: Kubectl, namespace: str) -> list[Any]:
    return list(kubectl.json("get", "pods", "-n", namespace, "-l", harness.LABEL_SERVER)["items"])


@contextlib.asynccontextmanager
async def members_running(kubectl: Kubectl, namespace: str) -> AsyncIterator[list[set[str]]]:
    """After every pod event, the members with a pod that may hold a GPU, placed on a node
    and not finished (terminating ones too): a watch, so an overlap however short is seen.
    A pod behind its slot gate is not placed and holds nothing."""
    samples: list[set[str]] = []
    seen: dict[str, str | None] = {}
    process = await asyncio.create_subprocess_exec(
        kubectl.binary, f"--kubeconfig={kubectl.kubeconfig}", "get", "pods", "-n", namespace,
        "-l", harness.LABEL_SERVER, "--watch", "--output-watch-events", "-o", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert process.stdout is not None

    async def read() -> None:
        assert process.stdout is not None
        buffer = ""
        while chunk := await process.stdout.read(65536):
            events, buffer = harness.split_json_stream(buffer + chunk.decode())
            for event in events:
                pod = event["object"]
                phase = (pod.get("status") or {}).get("phase")
                gone = (event["type"] == "DELETED" or phase in ("Succeeded", "Failed")
                        or not (pod.get("spec") or {}).get("nodeName"))
                seen[pod["metadata"]["name"]] = None if gone else (
                    pod["metadata"]["labels"][harness.LABEL_SERVER])
                samples.append({m for m in seen.values() if m})

    task = asyncio.create_task(read())
    try:
        yield samples
    finally:
        process.terminate()
        await process.wait()
        await asyncio.wait_for(task, 10)


async def test_two_members_that_both_fit_on_the_node_never_run_together(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    """Both members pinned to the node with two GPUs, so the scheduler alone would run both;
    the incumbent takes 3 s to unload. Through a router on the control-plane node (no
    GPUs), a request for the other member swaps, and a watch of every pod event shows the
    target's pod only once the incumbent's is gone. The target has `scratch: false`: no
    volume at all, and it still runs and serves under a read-only root."""
    ns = restricted_namespace
    async with members_running(kind_kubectl, ns) as samples:
        harness.apply(kind_kubectl, ns, member("alpha", TWO_GPUS, unload_time=3),
                      member("beta", TWO_GPUS, scratch=False),
                      harness.pool("slot", ["alpha", "beta"],
                                                             default="alpha"),
                      router_on_control_plane("chat", ["alpha", "beta"]))
        (router,) = await asyncio.to_thread(harness.wait_router_ready, kind_kubectl, ns,
                                            "chat", None, 180.0)
        await asyncio.to_thread(harness.wait_pool_ready, kind_kubectl, ns, "slot", "alpha",
                                180.0)
        client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                    max_retries=0, timeout=180)
        first = await client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert first.choices[0].message.content
        swapped = await client.chat.completions.create(
            model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert swapped.choices[0].message.content
        await client.close()
        await asyncio.to_thread(harness.wait_pool_ready, kind_kubectl, ns, "slot", "beta",
                                60.0)
    assert {"alpha"} in samples and {"beta"} in samples, samples
    assert all(len(s) <= 1 for s in samples), [s for s in samples if len(s) > 1]

    # The router runs where there is no GPU; the member it reached, on the other node.
    router_node = kind_kubectl.json("get", "pod", "-n", ns, router.name)["spec"]["nodeName"]
    assert router_node == CONTROL_PLANE
    (beta,) = [p for p in member_pods(kind_kubectl, ns)
               if p["metadata"]["labels"][harness.LABEL_SERVER] == "beta"
               and not p["metadata"].get("deletionTimestamp")]
    assert beta["spec"]["nodeName"] == TWO_GPUS
    assert "volumes" not in beta["spec"], beta["spec"].get("volumes")
    # It sees the device the plugin allocated, which nothing in its spec declared.
    declared = json.dumps(beta["spec"])
    assert "NVIDIA_VISIBLE_DEVICES" not in declared
    env = kind_kubectl("exec", "-n", ns, beta["metadata"]["name"], "--", "python3", "-c",
                       "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'], "
                       "os.environ['MODELPOOL_GPU_LOCK_DIR'], os.getuid())").stdout.split()
    assert env[0] in ("0", "1") and env[1] == "/run/modelpool-gpu-locks", env
    assert env[2] != "0", "the member runs as root"
    # The namespace enforces restricted; the kubelet gave both a read-only root.
    for pod in (beta["metadata"]["name"], router.name):
        out = kind_kubectl("exec", "-n", ns, pod, "--", "python3", "-c",
                           ROOT_FS_PROBE).stdout.split()
        assert out[0] != "0" and out[1] == "read-only", (pod, out)


def test_a_member_whose_image_cannot_be_pulled_is_reported_by_the_kubelets_reason(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    """No image of that name was side-loaded and nothing can be pulled here, so the real
    kubelet reports ErrImagePull, then ImagePullBackOff. The pool says which, in the
    kubelet's words, rather than waiting out its swap budget in silence; the member loads
    once its image is one the node has."""
    ns = restricted_namespace
    missing = "modelpool/never-built:e2e"
    harness.apply(kind_kubectl, ns, member("alpha", TWO_GPUS, image=missing),
                  harness.pool("slot", ["alpha"], default="alpha", swap_budget="600s"))

    def pulling() -> harness.Json | None:
        ready = harness.condition(harness.get(kind_kubectl, ns, f"modelpools.{harness.GROUP}",
                                              "slot"), "Ready") or {}
        return ready if ready.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    ready = harness.eventually(pulling, "the pool to say its image cannot be pulled", 120)
    assert ready["status"] == "False"
    assert ready["message"].startswith("alpha is not starting: container "), ready
    assert missing in ready["message"], ready
    server = harness.get(kind_kubectl, ns, f"modelservers.{harness.GROUP}", "alpha")
    said = harness.condition(server, "Ready") or {}
    assert said.get("reason") in ("ErrImagePull", "ImagePullBackOff"), said

    harness.apply(kind_kubectl, ns, member("alpha", TWO_GPUS))
    harness.wait_pool_ready(kind_kubectl, ns, "slot", "alpha", 180.0)


# The user a container runs as, and how its root filesystem is mounted (as the kubelet
# and the runtime set it up, read from inside).
ROOT_FS_PROBE = (
    "import os\n"
    "root = [line.split()[3].split(',') for line in open('/proc/self/mounts')\n"
    "        if line.split()[1] == '/']\n"
    "print(os.getuid(), 'read-only' if 'ro' in root[-1] else 'writable')\n"
)


def test_the_reconciler_runs_restricted_checked_by_the_kubelet(kind_kubectl: Kubectl) -> None:
    ns = kind_kubectl.json("get", "namespace", "modelpool-system")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = kind_kubectl.json("get", "pods", "-n", "modelpool-system", "-l",
                             "app.kubernetes.io/name=modelpool-reconciler")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running, pods
    out = kind_kubectl("exec", "-n", "modelpool-system", running[0]["metadata"]["name"], "--",
                       "python3", "-c", ROOT_FS_PROBE).stdout.split()
    assert out[0] != "0" and out[1] == "read-only", out


def real_member(name: str, model: str) -> harness.Json:
    """A ModelServer run by the real llama-server (modelpool/llama-server), pinned to the
    node with two GPUs; one slot, so a generation in flight makes it busy. The test reads
    its /slots from this machine, so it admits direct access."""
    return harness.on_node({
        "apiVersion": harness.API_VERSION, "kind": "ModelServer", "metadata": {"name": name},
        "spec": {"runtime": "llamacpp", "image": "modelpool/llama-server:e2e",
                 "model": model, "args": ["-c", "2048", "-np", "1"],
                 "resources": {"gpu": 1}, "allowDirectAccess": True},
    }, TWO_GPUS)



async def test_a_real_llama_server_in_flight_defers_the_swap_until_it_ends(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    """The drain judged by llama.cpp itself: while a long generation runs on the real
    incumbent, its /slots say busy and the swap waits (SwapDeferred, PodsBusy); when the
    generation ends, whole, the swap proceeds and the other real member answers."""
    ns = restricted_namespace
    harness.apply(kind_kubectl, ns, real_member("alpha", "/models/alpha-large.gguf"),
                  real_member("beta", "/models/beta.gguf"),
                  harness.pool("slot", ["alpha", "beta"], default="alpha", swap_budget="300s"),
                  router_on_control_plane("chat", ["alpha", "beta"]))
    (router,) = await asyncio.to_thread(harness.wait_router_ready, kind_kubectl, ns, "chat",
                                        None, 180.0)
    await asyncio.to_thread(harness.wait_pool_ready, kind_kubectl, ns, "slot", "alpha", 180.0)
    (alpha,) = [p for p in member_pods(kind_kubectl, ns)
                if p["metadata"]["labels"][harness.LABEL_SERVER] == "alpha"]
    client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                max_retries=0, timeout=240)
    hello = await client.chat.completions.create(
        model="alpha", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert hello.model == "/models/alpha-large.gguf"  # llama-server's own name for it
    # About 50 tokens/s: 400 tokens keep the only slot busy for several seconds.
    long = asyncio.create_task(client.completions.create(
        model="alpha", prompt="the pool", max_tokens=400))
    # (in a thread: the loop must keep sending the generation meanwhile)
    ip = alpha["status"]["podIP"]
    await asyncio.to_thread(harness.eventually,
                            lambda: True if harness.slots_busy(ip) else None,
                            "alpha's slot to be processing", 30)
    swapped = asyncio.create_task(client.chat.completions.create(
        model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=4))

    def deferred() -> harness.Json | None:
        obj = harness.get(kind_kubectl, ns, f"modelpools.{harness.GROUP}", "slot")
        c = harness.condition(obj, "SwapDeferred")
        return c if c and c["status"] == "True" and c["reason"] == "PodsBusy" else None

    await asyncio.to_thread(harness.eventually, deferred, "the swap deferred as PodsBusy", 30)
    assert not long.done() and not swapped.done()
    whole = await long
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 400
    reply = await swapped
    assert reply.model == "/models/beta.gguf" and reply.choices[0].message.content
    await client.close()
    # The reply can come before the status says so (the router probes the target itself).
    status = (await asyncio.to_thread(harness.wait_pool_ready, kind_kubectl, ns, "slot", "beta",
                                      30.0))["status"]
    assert status["residentMember"] == "beta"
    assert status["lastSwap"]["outcome"] == "Succeeded"
