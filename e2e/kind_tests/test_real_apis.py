"""Every API through the router on kind, judged by the official SDKs: the OpenAI Responses
API and the Anthropic Messages API against a pool of real llama-server members, each
request issued while another member is resident, so that it starts and waits through a
swap; the Anthropic client's own key header and its 401; an audio transcription whose
`model` is a form field (a fake member, llama-server has no speech model here); and the
door `/upstream/{backend}/...` to a member that is not resident."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest

from e2e import harness
from e2e.kind_tests.test_kind import CONTROL_PLANE
from e2e.kind_tests.test_real_members import llama, swaps_to
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

POOL, ROUTER, KEY = "slot", "agents", "sk-modelpool-e2e"
ASK: Any = [{"role": "user", "content": "the pool"}]


async def swapped(kubectl: Kubectl, ns: str, member: str) -> float:
    """The swaps to `member` once the pool says it is done: the router sends a held request
    on the target's first ready answer, before the reconciler ends the swap and counts it."""
    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, member, 60.0)
    return swaps_to(kubectl, ns, member)


def get(url: str, key: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key
                                     else {})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_responses_messages_audio_and_the_upstream_door_through_swaps(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    kubectl("create", "secret", "generic", "router-keys", "-n", ns, f"--from-literal=keys={KEY}")
    router = harness.router_on_node(harness.router(ROUTER, ["beta", "gemma", "whisper"]),
                                    CONTROL_PLANE)
    router["spec"]["proxy"]["apiKeySecret"] = {"name": "router-keys"}
    harness.apply(
        kubectl, ns,
        llama("beta", "/models/beta.gguf"),
        llama("gemma", "/models/gemma.gguf"),
        harness.fake_member("whisper", load_time=0.5),
        harness.pool(POOL, ["beta", "gemma", "whisper"], default="beta", swap_budget="180s"),
        router,
    )
    (pod,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns, ROUTER, None, 180.0)
    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "beta", 180.0)
    base = harness.base_url(pod)
    root = base.removesuffix("/v1")
    oa = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=180)
    an = anthropic.AsyncAnthropic(base_url=root, api_key=KEY, max_retries=0, timeout=180)
    try:
        # Responses, plain, while beta is resident: a swap to gemma.
        before = swaps_to(kubectl, ns, "gemma")
        answer = await oa.responses.create(model="gemma", input="the pool",
                                           max_output_tokens=5)
        assert answer.status == "completed" and answer.output_text
        assert answer.usage is not None and answer.usage.output_tokens == 5
        assert await swapped(kubectl, ns, "gemma") == before + 1

        # Responses, streamed, while gemma is resident: a swap back to beta.
        before = swaps_to(kubectl, ns, "beta")
        stream = await oa.responses.create(model="beta", input="the pool",
                                           max_output_tokens=4, stream=True)
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
        assert kinds.count("response.output_text.delta") == 4, kinds
        assert await swapped(kubectl, ns, "beta") == before + 1

        # Messages, plain, while beta is resident.
        before = swaps_to(kubectl, ns, "gemma")
        message = await an.messages.create(model="gemma", max_tokens=5, messages=ASK)
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
        assert message.content[0].type == "text" and message.content[0].text
        assert await swapped(kubectl, ns, "gemma") == before + 1

        # Messages, streamed, while gemma is resident.
        before = swaps_to(kubectl, ns, "beta")
        async with an.messages.stream(model="beta", max_tokens=4, messages=ASK) as streamed:
            text = "".join([piece async for piece in streamed.text_stream])
            final = await streamed.get_final_message()
        assert text and final.content[0].type == "text" and final.content[0].text == text
        assert await swapped(kubectl, ns, "beta") == before + 1

        counted = await an.messages.count_tokens(model="beta", messages=ASK)
        assert counted.input_tokens > 0

        # The Anthropic client with a wrong key: its own 401, in its own shape.
        async with anthropic.AsyncAnthropic(base_url=root, api_key="wrong",
                                            max_retries=0) as stranger:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await stranger.messages.create(model="beta", max_tokens=2, messages=ASK)
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["error"]["type"] == "authentication_error"

        # An audio transcription names its model in the form: a swap to the fake member.
        heard = await oa.audio.transcriptions.create(model="whisper",
                                                     file=("clip.wav", b"RIFF" + bytes(4096)))
        assert heard.text == "whisper heard 4100 bytes of audio"
        await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "whisper", 30.0)

        # The door to a member's own paths: gemma is not resident, and is loaded for it.
        assert (await asyncio.to_thread(get, f"{root}/upstream/gemma/props", None))[0] == 401
        status, props = await asyncio.to_thread(get, f"{root}/upstream/gemma/props", KEY)
        assert status == 200 and props["default_generation_settings"]["n_ctx"] > 0, props
        await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, POOL, "gemma", 30.0)
    finally:
        await oa.close()
        await an.close()
