"""A conversation survives a swap on kind: a real llama-server member whose `kvCache` is
persisted to a claim on its node, and a fake vLLM member, in one pool behind a router,
driven with the `openai` SDK. A conversation of more than 2,000 tokens on the llama.cpp
member, a swap to the other and back, and the next turn is served from the restored cache:
llama-server's own `timings.cache_n` covers the earlier context. With `persist` off the
same turn computes everything again (`cache_n` 0), and a cache saved for another context
size is not restored. Restored or discarded, the member's slot files leave the claim."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.kind_tests.test_kind import CONTROL_PLANE, ONE_GPU
from e2e.kind_tests.test_real_members import fake_vllm, llama
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

POOL, ROUTER, CLAIM = "slot", "chat", "kv-cache"
# 45 tokens a sentence for the generated models' tokenizer: some 2,250 in all.
CONTEXT = " ".join(["the pool shares one GPU between its members."] * 50)
# The generated models are trained for 2,048 tokens, and llama-server caps a slot's context
# to that: their metadata says more.
LONGER = ("--override-kv", "llama.context_length=int:16384")


def conversation_member(persist: bool, ctx: int = 4096) -> harness.Json:
    server = harness.on_node(
        llama("gemma", "/models/gemma.gguf", *LONGER, "-c", str(ctx), "-np", "1"), ONE_GPU)
    # llama() sets -c 2048 first; llama-server takes the last value of an argument.
    if persist:
        server["spec"]["kvCache"] = {"persist": True, "pvc": CLAIM}
    return server


async def turn(client: openai.AsyncOpenAI, messages: list[Any]) -> tuple[str, int, int]:
    """The reply's text, its prompt's tokens and how many of them came from the cache."""
    reply = await client.chat.completions.create(model="gemma", messages=messages,
                                                 max_tokens=8, temperature=0)
    timings = (reply.model_extra or {}).get("timings") or {}
    assert reply.usage is not None and "cache_n" in timings, reply
    return reply.choices[0].message.content or "", reply.usage.prompt_tokens, timings["cache_n"]


async def swap_away_and_back(client: openai.AsyncOpenAI, kubectl: Kubectl, ns: str) -> None:
    reply = await client.chat.completions.create(model="qwen", messages=[
        {"role": "user", "content": "hello"}], max_tokens=2)
    assert reply.model == "qwen"
    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "qwen", 120.0)


def on_node(script: str, check: bool = True) -> None:
    subprocess.run(["docker", "exec", ONE_GPU, "sh", "-c", script], check=check, timeout=60)


def slot_files(directory: str) -> list[str]:
    """The slot files on the claim (a manifest or anything else aside)."""
    done = subprocess.run(["docker", "exec", ONE_GPU, "ls", "-1", directory],
                          capture_output=True, text=True, timeout=30, check=True)
    return sorted(f for f in done.stdout.split() if f.endswith(".bin"))


def claim_emptied(directory: str) -> None:
    harness.eventually(lambda: True if not slot_files(directory) else None,
                       "the restored slot files removed from the claim", 60.0,
                       lambda: slot_files(directory))


@pytest.mark.parametrize("persist", [True, False], ids=["persist", "no-persist"])
async def test_the_next_turn_after_a_swap_is_served_from_the_restored_cache(
    kind_kubectl: Kubectl, restricted_namespace: str, persist: bool,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    directory = f"/var/lib/modelpool-test/{ns}"
    await asyncio.to_thread(on_node, f"mkdir -p {directory} && chmod 0777 {directory}")
    pv, pvc = harness.node_volume(ns, CLAIM, ONE_GPU, directory, access="ReadWriteOnce")
    harness.apply(kubectl, ns, pv)
    try:
        harness.apply(kubectl, ns, pvc, conversation_member(persist), fake_vllm("qwen"),
                      harness.pool(POOL, ["gemma", "qwen"], default="gemma",
                                   swap_budget="180s"),
                      harness.router_on_node(harness.router(ROUTER, ["gemma", "qwen"]),
                                             CONTROL_PLANE))
        (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns, ROUTER,
                                            None, 180.0)
        await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "gemma", 180.0)
        client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                    max_retries=0, timeout=180)
        try:
            messages: list[Any] = [{"role": "user", "content": CONTEXT}]
            answer, context, cached = await turn(client, messages)
            assert context >= 2000 and cached == 0, (context, cached)

            await swap_away_and_back(client, kubectl, ns)
            away = harness.pool_status(kubectl, ns, POOL)["lastSwap"]
            saved = "save" in [p["name"] for p in away.get("phases") or []]
            assert saved == persist, away
            if persist:
                assert await asyncio.to_thread(slot_files, directory), (
                    "no slot file on the claim after the swap away")
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "and then?"}]
            _, prompt, cached = await turn(client, messages)
            # The router may answer on its own early probe of gemma before the pool's
            # status says the swap ended (docs/router.md): the status is waited for.
            await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "gemma", 60.0)
            status = harness.pool_status(kubectl, ns, POOL)
            assert status["lastSwap"]["to"] == "gemma", status["lastSwap"]
            if not persist:
                assert cached == 0, cached
                return
            # Everything the first turn read (and wrote) came back from the file.
            assert context <= cached < prompt, (context, cached, prompt)
            phases = [p["name"] for p in status["lastSwap"].get("phases") or []]
            assert "restore" in phases, status["lastSwap"]
            # The manifest that named the file is consumed: nothing restores it again.
            member = harness.get(kubectl, ns, f"modelservers.{harness.GROUP}", "gemma")
            assert "kvCache" not in (member.get("status") or {}), member["status"]
            # ...and its files removed by the pod's kv-files container, which the
            # reconciler reaches through the member's NetworkPolicy
            await asyncio.to_thread(claim_emptied, directory)

            # Saved again on the way out; the member comes back with another context size:
            # that cache is not restored.
            await swap_away_and_back(client, kubectl, ns)
            harness.apply(kubectl, ns, conversation_member(persist, ctx=3072))
            messages += [{"role": "assistant", "content": "more"},
                         {"role": "user", "content": "again?"}]
            _, prompt, cached = await turn(client, messages)
            assert cached == 0, (cached, prompt)
            await asyncio.to_thread(claim_emptied, directory)  # discarded: removed too
        finally:
            await client.close()
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kubectl("delete", "pv", pv["metadata"]["name"], "--wait=false", check=False)
        await asyncio.to_thread(on_node, f"rm -rf {directory}", False)
