"""A pool with a memory budget on kind, driven through its router with the `openai` SDK:
two real llama-server members and a fake one in vLLM mode, 8 GiB each in a 16 GiB budget
(any two fit, three do not). Requests alternating between two that fit never swap: both
stay resident, the router serves both at once, no pod of either is replaced. A request
for the third evicts an idle resident, never the one busy with a generation, whose stream
ends whole. A watch of the members' pods finds at most two placed at any moment.

The same pool on the fake device plugin's shared mode (no claim, no DRA): one node's GPU
advertised three times with 16 GiB, the members pinned there, one share each. The scheduler
would place all three; the budget keeps two, and a sampler of the device's memory ledger
(the charges that live servers hold, e2e/fake_model/gpu_ledger.py) never finds more than the
16 GiB charged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.kind_tests.test_kind import CONTROL_PLANE, ONE_GPU, allocatable, plugin_pod
from e2e.kind_tests.test_real_members import fake_vllm, llama, streamed_text
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

POOL, ROUTER = "shared", "chat"
ASK: Any = [{"role": "user", "content": "the pool"}]
SELECTOR = "modelpool.dev/pool=shared"


def members_without_gpus(*servers: harness.Json) -> list[harness.Json]:
    """Sharing the device is the budget's job here, not the scheduler's: the members
    request no whole GPU each (docs/api.md, how a budgeted pool's members share it)."""
    for server in servers:
        server["spec"]["resources"] = {"gpu": 0}
    return list(servers)


@contextlib.asynccontextmanager
async def placed_members(kubectl: Kubectl, ns: str) -> AsyncIterator[list[set[str]]]:
    """Which members have a pod placed on a node, after every pod event: `kubectl get
    --watch`, so an overlap however short is seen."""
    samples: list[set[str]] = []
    process = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kubectl.kubeconfig), "get", "pods", "-n", ns, "-l",
        SELECTOR, "--watch", "--output-watch-events", "-o", "json",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    placed: dict[str, str] = {}

    async def read() -> None:
        assert process.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        while chunk := await process.stdout.read(65536):
            buffer += chunk.decode()
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break
                buffer = buffer.lstrip()[end:]
                pod = event["object"]
                name = pod["metadata"]["name"]
                member = pod["metadata"]["labels"].get("modelpool.dev/model-server", "")
                gone = event["type"] == "DELETED" or pod["status"].get("phase") in (
                    "Succeeded", "Failed")
                if gone or not pod["spec"].get("nodeName"):
                    placed.pop(name, None)
                else:
                    placed[name] = member
                samples.append(set(placed.values()))

    reader = asyncio.create_task(read())
    try:
        yield samples
    finally:
        process.terminate()
        await process.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


def residents(kubectl: Kubectl, ns: str) -> set[str]:
    status = harness.pool_status(kubectl, ns, POOL)
    return {r["name"] for r in status.get("residents") or []}


async def until_residents(kubectl: Kubectl, ns: str, wanted: set[str]) -> harness.Json:
    def check() -> harness.Json | None:
        status = harness.pool_status(kubectl, ns, POOL)
        names = {r["name"] for r in status.get("residents") or []}
        return status if names == wanted and status.get("phase") == "Ready" else None

    return await asyncio.to_thread(harness.eventually, check, f"residents {sorted(wanted)}",
                                   180.0)


def pod_uids(kubectl: Kubectl, ns: str, member: str) -> set[str]:
    return {p.uid for p in harness.list_pods(kubectl, ns, f"modelpool.dev/model-server={member}")}


async def test_members_that_fit_stay_resident_and_a_busy_one_is_never_evicted(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    pool = harness.pool(POOL, ["gemma", "alpha", "qwen"], default="gemma", swap_budget="180s",
                        gpuMemory="16Gi")
    for entry in pool["spec"]["members"]:
        entry["gpuMemory"] = "8Gi"
    async with placed_members(kubectl, ns) as samples:
        harness.apply(
            kubectl, ns,
            *members_without_gpus(llama("gemma", "/models/gemma.gguf"),
                                  llama("alpha", "/models/alpha-large.gguf"),
                                  fake_vllm("qwen")),
            pool,
            harness.router_on_node(harness.router(ROUTER, ["gemma", "alpha", "qwen"]),
                                   CONTROL_PLANE),
        )
        (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns, ROUTER,
                                            None, 180.0)
        await until_residents(kubectl, ns, {"gemma"})
        client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                    max_retries=0, timeout=180)
        try:
            # alpha fits beside gemma: loaded at once, gemma not drained.
            gemma_pods = pod_uids(kubectl, ns, "gemma")
            await client.chat.completions.create(model="alpha", messages=ASK, max_tokens=2)
            status = await until_residents(kubectl, ns, {"gemma", "alpha"})
            assert status["lastSwap"]["to"] == "alpha" and status["lastSwap"]["evicted"] == []
            # Alternating between the two: served at once, nothing loads or unloads.
            for model in ("gemma", "alpha", "gemma", "alpha", "gemma"):
                reply = await client.chat.completions.create(model=model, messages=ASK,
                                                             max_tokens=2)
                assert reply.model.endswith(f"{model}.gguf") or reply.model == model, reply
            assert harness.pool_status(kubectl, ns, POOL)["lastSwap"] == status["lastSwap"]
            assert pod_uids(kubectl, ns, "gemma") == gemma_pods
            # alpha busy with a long generation (about 50 tokens/s here); gemma idle. qwen
            # needs one of them to go: gemma, never the busy one.
            stream = await client.chat.completions.create(
                model="alpha", messages=ASK, max_tokens=400, stream=True)
            await anext(aiter(stream))  # generating: alpha is busy from here on
            qwen = asyncio.create_task(client.chat.completions.create(
                model="qwen", messages=ASK, max_tokens=2))
            text, finish = await streamed_text(stream)
            assert finish == "length" and text, "the busy member's stream ended whole"
            await qwen
            status = await until_residents(kubectl, ns, {"alpha", "qwen"})
            assert status["lastSwap"]["to"] == "qwen"
            assert status["lastSwap"]["evicted"] == ["gemma"], status["lastSwap"]
        finally:
            await client.close()
    assert samples, "no pod was seen"
    assert all(len(s) <= 2 for s in samples), [s for s in samples if len(s) > 2]
    assert {"gemma", "alpha"} in samples


GIB = 1 << 30
SHARES = {"modelpool.dev/fake-gpu-shares": "3", "modelpool.dev/fake-gpu-memory-mib": "16384"}
LEDGER = "/var/lib/modelpool-fake-gpu/locks/gpu0.charges"
# The charges whose holders live: a charge file's inode among the node's flocks (a dead
# server's file stays until the next load sweeps it, and holds no lock).
LIVE_CHARGES = (
    f"for f in {LEDGER}/*.charge; do [ -e \"$f\" ] || continue; "
    "i=$(stat -c %i \"$f\"); grep -q \":$i \" /proc/locks && cut -d' ' -f1 \"$f\"; done; true")


def restart_plugin(kubectl: Kubectl, node: str, want: str) -> None:
    """The plugin reads its node's labels when it starts: delete its pod, and wait for the
    DaemonSet's next one to register `want` devices."""
    old = plugin_pod(kubectl, node)
    if old is not None:
        kubectl("delete", "pod", "-n", "kube-system", old["metadata"]["name"], "--wait=true")
    harness.eventually(lambda: True if allocatable(kubectl, node) == want else None,
                       f"{node} to advertise {want} nvidia.com/gpu", 120)


@pytest.fixture
def shared_gpu_node(kind_kubectl: Kubectl) -> Iterator[str]:
    """The one-GPU node with its device advertised three times, 16 GiB; as before after."""
    kind_kubectl("label", "node", ONE_GPU, "--overwrite",
                 *(f"{k}={v}" for k, v in SHARES.items()))
    try:
        restart_plugin(kind_kubectl, ONE_GPU, "3")
        yield ONE_GPU
    finally:
        kind_kubectl("label", "node", ONE_GPU, *(f"{k}-" for k in SHARES))
        restart_plugin(kind_kubectl, ONE_GPU, "1")


def charged_bytes(node: str) -> int:
    done = subprocess.run(["docker", "exec", node, "sh", "-c", LIVE_CHARGES],
                          capture_output=True, text=True, timeout=30, check=True)
    return sum(int(line) for line in done.stdout.split())


async def test_the_budget_holds_on_a_shared_device_plugin_gpu(
    kind_kubectl: Kubectl, restricted_namespace: str, shared_gpu_node: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    pool = harness.pool(POOL, ["gemma", "alpha", "qwen"], default="gemma", swap_budget="180s",
                        gpuMemory="16Gi")
    for entry in pool["spec"]["members"]:
        entry["gpuMemory"] = "8Gi"
    servers = [harness.on_node(s, shared_gpu_node) for s in (
        llama("gemma", "/models/gemma.gguf"), llama("alpha", "/models/alpha-large.gguf"),
        fake_vllm("qwen"))]
    with harness.sampled(lambda: charged_bytes(shared_gpu_node), "the GPU's ledger") as charges:
        async with placed_members(kubectl, ns) as samples:
            harness.apply(kubectl, ns, *servers, pool, harness.router_on_node(
                harness.router(ROUTER, ["gemma", "alpha", "qwen"]), CONTROL_PLANE))
            (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns,
                                                ROUTER, None, 180.0)
            await until_residents(kubectl, ns, {"gemma"})
            client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                        max_retries=0, timeout=180)
            try:
                await client.chat.completions.create(model="alpha", messages=ASK, max_tokens=2)
                status = await until_residents(kubectl, ns, {"gemma", "alpha"})
                assert status["lastSwap"]["evicted"] == []
                await asyncio.to_thread(harness.eventually,
                                        lambda: True if charged_bytes(shared_gpu_node) == 16 * GIB
                                        else None, "both residents charged", 60.0)
                # gemma was used last but one: the third evicts it.
                await client.chat.completions.create(model="gemma", messages=ASK, max_tokens=2)
                await client.chat.completions.create(model="alpha", messages=ASK, max_tokens=2)
                await client.chat.completions.create(model="qwen", messages=ASK, max_tokens=2)
                status = await until_residents(kubectl, ns, {"alpha", "qwen"})
                assert status["lastSwap"]["evicted"] == ["gemma"], status["lastSwap"]
            finally:
                await client.close()
    assert samples and all(len(s) <= 2 for s in samples), [s for s in samples if len(s) > 2]
    assert charges and max(charges) == 16 * GIB, sorted(set(charges))
