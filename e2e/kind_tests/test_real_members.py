"""A pool of two real llama.cpp members and one fake vLLM member on kind, used through the
router with the official `openai` SDK: the cold load, swaps between real servers,
coalescing, chat and text completions streamed and not, `/v1/models`, embeddings from a
member started for them, and llama.cpp's own 400 for a prompt over its context."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.kind_tests.test_kind import CONTROL_PLANE, ONE_GPU
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

POOL, ROUTER = "slot", "chat"
HELLO: Any = [{"role": "user", "content": "hello"}]


def llama(name: str, model: str, *extra: str) -> harness.Json:
    """A ModelServer run by the real llama-server with a model the image carries."""
    return {
        "apiVersion": harness.API_VERSION, "kind": "ModelServer", "metadata": {"name": name},
        "spec": {"runtime": "llamacpp", "image": "modelpool/llama-server:e2e", "model": model,
                 "args": ["--alias", name, "-c", "2048", *extra], "resources": {"gpu": 1}},
    }


def fake_vllm(name: str) -> harness.Json:
    return {
        "apiVersion": harness.API_VERSION, "kind": "ModelServer", "metadata": {"name": name},
        "spec": {"runtime": "vllm", "image": harness.FAKE_MODEL_IMAGE, "model": f"/models/{name}",
                 "args": ["--mode", "vllm"], "resources": {"gpu": 1}},
    }


def swaps_to(kubectl: Kubectl, namespace: str, member: str) -> float:
    pod = harness.reconciler_pod(kubectl, harness.Installation(harness.RECONCILER, None))
    families = harness.scrape(harness.metrics_url(pod))
    return harness.sample_sum(families, "modelpool_swaps_total", namespace=namespace, pool=POOL,
                              to=member)


async def streamed_text(stream: Any) -> tuple[str, str | None]:
    text, finish = "", None
    async for chunk in stream:
        if chunk.choices:
            choice = chunk.choices[0]
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text += piece or ""
            finish = choice.finish_reason or finish
    return text, finish


async def test_two_real_llama_members_and_a_fake_vllm_one_through_the_router(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    harness.apply(
        kubectl, ns,
        llama("beta", "/models/beta.gguf"),
        llama("gemma", "/models/gemma.gguf", "--embeddings", "--pooling", "mean"),
        fake_vllm("qwen"),
        harness.pool(POOL, ["beta", "gemma", "qwen"], default="beta", swap_budget="180s"),
        harness.router_on_node(harness.router(ROUTER, ["beta", "gemma", "qwen"]), CONTROL_PLANE),
    )
    (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns, ROUTER, None,
                                        180.0)
    # The cold load of the default.
    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "beta", 180.0)
    client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                max_retries=0, timeout=120)
    try:
        listed = {m.id for m in (await client.models.list()).data}
        assert {"beta", "gemma", "qwen"} <= listed, listed

        reply = await client.chat.completions.create(model="beta", messages=HELLO, max_tokens=6)
        assert reply.model == "beta" and reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 6
        text, finish = await streamed_text(await client.completions.create(
            model="beta", prompt="the pool", max_tokens=6, stream=True))
        assert text and finish == "length"

        # llama.cpp's own 400, unchanged by the router.
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model="beta", prompt="the pool " * 3000,
                                            max_tokens=4)
        body = too_long.value.body
        assert isinstance(body, dict) and body.get("type") == "exceed_context_size_error", body

        # A swap to a real member, three requests coalesced into it.
        before = swaps_to(kubectl, ns, "gemma")
        coalesced = await asyncio.gather(*(
            client.chat.completions.create(model="gemma", messages=HELLO, max_tokens=4)
            for _ in range(3)))
        assert all(r.model == "gemma" and r.choices[0].message.content for r in coalesced)
        await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "gemma", 30.0)
        assert swaps_to(kubectl, ns, "gemma") == before + 1
        router_families = harness.scrape(harness.metrics_url(router))
        assert harness.sample_sum(router_families, "modelpool_coalesced_total") >= 2

        # Embeddings from the member started with --embeddings.
        embedded = await client.embeddings.create(model="gemma", input=["the pool", "one GPU"])
        vectors = [e.embedding for e in embedded.data]
        assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
        assert vectors[0] != vectors[1]

        # And to the fake vLLM member, streamed.
        text, finish = await streamed_text(await client.chat.completions.create(
            model="qwen", messages=HELLO, max_tokens=5, stream=True))
        assert text and finish == "length"
        status = (await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "qwen",
                                          30.0))["status"]
        assert status["lastSwap"]["from"] == "gemma"
        assert status["lastSwap"]["outcome"] == "Succeeded"
    finally:
        await client.close()


GRACE_SECONDS = 5  # what the reconciler renders for a llama.cpp member (templates say why)



async def test_a_member_deleted_with_a_non_streamed_request_in_flight_frees_the_gpu_in_grace(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    """llama-server abandons a non-streamed generation on SIGTERM and then waits for its
    client: the pod ends at the SIGKILL of its grace period, the GPU comes back, the request
    in flight ends (answered again, or an OpenAI error; never left hanging), and the pool
    serves the member again from a new pod."""
    ns, kubectl = restricted_namespace, kind_kubectl
    alpha = harness.on_node(llama("alpha", "/models/alpha-large.gguf", "-np", "1"), ONE_GPU)
    alpha["spec"]["allowDirectAccess"] = True  # the test reads its /slots from here
    harness.apply(
        kubectl, ns,
        alpha,
        harness.pool(POOL, ["alpha"], default="alpha", swap_budget="180s"),
        harness.router_on_node(harness.router(ROUTER, ["alpha"]), CONTROL_PLANE),
    )
    (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns, ROUTER, None,
                                        180.0)
    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "alpha", 180.0)
    rendered = harness.get(kubectl, ns, "deployment", "alpha")
    assert rendered["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == GRACE_SECONDS
    (pod,) = harness.member_pods(kubectl, ns, "alpha")
    assert pod.ip is not None
    client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                max_retries=0, timeout=240)
    try:
        # About 50 tokens/s: 500 tokens keep the only slot busy well past the SIGTERM.
        in_flight = asyncio.create_task(client.completions.create(
            model="alpha", prompt="the pool", max_tokens=500))
        await asyncio.to_thread(harness.eventually,
                                lambda: True if harness.slots_busy(str(pod.ip)) else None,
                                "alpha's slot processing", 30)
        deleted = time.monotonic()
        kubectl("delete", "pod", pod.name, "-n", ns, "--wait=false")

        def gone() -> bool | None:
            names = {p.name for p in harness.member_pods(kubectl, ns, "alpha")}
            return True if pod.name not in names else None

        await asyncio.to_thread(harness.eventually, gone, f"pod {pod.name} gone", 60)
        gone_after = time.monotonic() - deleted
        # The generation was cut by the SIGTERM, not finished before it: no reply came from
        # the pod that is gone (its replacement is not Ready yet to answer it again).
        assert not (in_flight.done() and in_flight.exception() is None), \
            "the generation ended before the pod was told to stop"
        # The grace period, and the kubelet's and the API server's own seconds.
        assert gone_after < GRACE_SECONDS + 10, f"the pod took {gone_after:.1f}s to go"
        # The request in flight ends: a reply (dispatched again) or an OpenAI-shaped error.
        outcome: object
        try:
            # Bounded by the client's own timeout: answered again, the request generates its
            # 500 tokens anew on the new pod, a minute or more on a loaded host.
            outcome = await in_flight
        except openai.APIStatusError as e:
            outcome = e
            assert e.status_code in (502, 503), (e.status_code, e.body)
            assert isinstance(e.body, dict) and e.body.get("type"), e.body
        # And the pool serves alpha again, from a new pod.
        reply = await client.chat.completions.create(model="alpha", messages=HELLO,
                                                     max_tokens=4)
        assert reply.choices[0].message.content, outcome
    finally:
        await client.close()
    (again,) = [p for p in harness.member_pods(kubectl, ns, "alpha") if not p.terminating]
    assert again.name != pod.name and again.ready
