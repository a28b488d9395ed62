"""The fake model server held to a real `llama-server` on the other APIs it speaks: the
OpenAI Responses API and the Anthropic Messages API through their official SDKs (a plain
answer, the full event sequence of a stream, an error), their token counts, and tokenize.
Rerank and audio transcription need a reranker or a speech model that the generated models
are not; the router's routing of them is tested against the fake alone
(tests/functional/test_apis_routed.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio

from tests.functional.test_llama_contract import NAME, Server, started

pytestmark = [pytest.mark.functional, pytest.mark.build("llama-server"),
              pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(params=["fake", "real"], scope="module", loop_scope="module")
async def server(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    """The servers of the contract of the OpenAI endpoints, the fake and the real one, each
    started once for this module: these tests only read from them."""
    where = tmp_path_factory.mktemp(f"apis-{request.param}")
    async with started(request.param, where) as running:
        yield running


RESPONSE_EVENTS_BEFORE = ["response.created", "response.in_progress",
                          "response.output_item.added", "response.content_part.added"]
RESPONSE_EVENTS_AFTER = ["response.output_text.done", "response.content_part.done",
                         "response.output_item.done", "response.completed"]


def openai_client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                              timeout=60)


def anthropic_client(server: Server) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.base_url, api_key="unused", max_retries=0,
                                    timeout=60)


async def test_a_response_answers_the_tokens_asked_for(server: Server) -> None:
    async with openai_client(server) as c:
        answer = await c.responses.create(model=NAME, input="the pool", max_output_tokens=5)
    assert answer.status == "completed"
    assert answer.output_text
    assert answer.usage is not None and answer.usage.output_tokens == 5


async def test_a_streamed_response_sends_llama_servers_event_sequence(server: Server) -> None:
    async with openai_client(server) as c:
        stream = await c.responses.create(model=NAME, input="the pool", max_output_tokens=4,
                                          stream=True)
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds == [*RESPONSE_EVENTS_BEFORE, *["response.output_text.delta"] * 4,
                     *RESPONSE_EVENTS_AFTER], kinds
    deltas = "".join(getattr(e, "delta", "") for e in events
                     if e.type == "response.output_text.delta")
    done = events[-1]
    assert done.type == "response.completed"
    assert done.response.output_text == deltas


async def test_a_response_without_input_is_a_400(server: Server) -> None:
    async with openai_client(server) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.responses.create(model=NAME, max_output_tokens=2)
    assert "'input' is required" in str(caught.value)


async def test_a_message_answers_the_tokens_asked_for(server: Server) -> None:
    async with anthropic_client(server) as c:
        answer = await c.messages.create(model=NAME, max_tokens=5, messages=[
            {"role": "user", "content": "the pool"}])
    assert answer.type == "message" and answer.role == "assistant"
    assert answer.stop_reason == "max_tokens"
    assert answer.content[0].type == "text" and answer.content[0].text
    assert answer.usage.output_tokens == 5


async def test_a_streamed_message_sends_the_messages_event_sequence(server: Server) -> None:
    async with anthropic_client(server) as c, c.messages.stream(
            model=NAME, max_tokens=4, messages=[{"role": "user", "content": "the pool"}]
    ) as stream:
        kinds = []
        text = ""
        async for event in stream:
            kinds.append(event.type)
            if event.type == "text":
                text += event.text
        final = await stream.get_final_message()
    raw = [k for k in kinds if k not in ("text",)]
    assert raw == ["message_start", "content_block_start", *["content_block_delta"] * 4,
                   "content_block_stop", "message_delta", "message_stop"], kinds
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.output_tokens == 4


async def test_messages_count_tokens_counts_the_prompt(server: Server) -> None:
    async with anthropic_client(server) as c:
        counted = await c.messages.count_tokens(model=NAME, messages=[
            {"role": "user", "content": "the pool shares one GPU"}])
    assert isinstance(counted.input_tokens, int) and counted.input_tokens > 0


async def _post(url: str, body: bytes) -> tuple[int, object]:
    async with aiohttp.ClientSession() as http, http.post(
            url, data=body, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def test_a_message_that_is_not_json_is_a_400_in_the_openai_shape(server: Server) -> None:
    status, body = await _post(server.base_url + "/v1/messages", b"not json")
    assert status == 400
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"


async def test_response_input_tokens_counts_the_input(server: Server) -> None:
    status, body = await _post(server.base_url + "/v1/responses/input_tokens",
                               b'{"model": "gemma", "input": "the pool"}')
    assert status == 200 and isinstance(body, dict)
    assert body["object"] == "response.input_tokens" and body["input_tokens"] > 0


async def test_tokenize_and_detokenize(server: Server) -> None:
    status, body = await _post(server.base_url + "/tokenize", b'{"content": "hello"}')
    assert status == 200 and isinstance(body, dict)
    tokens = body["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    status, body = await _post(server.base_url + "/detokenize", b'{"tokens": [1]}')
    assert status == 200 and isinstance(body, dict) and isinstance(body["content"], str)
