"""The fake server's pure pieces, checked without a server: its payloads must be what the
``openai`` SDK parses (its own models validate them here) and what docs/contracts.md
promises; /proc/locks parsing must see only granted locks."""

from __future__ import annotations

import base64
import struct

import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from e2e.fake_model import replies
from e2e.fake_model.gpu_lock import parse_proc_locks

pytestmark = pytest.mark.unit

USE = replies.usage(3, 4)


def test_tokens_are_words_that_join_into_text() -> None:
    assert [replies.token(i) for i in range(3)] == ["the", " pool", " shares"]
    assert replies.text_of(4) == "the pool shares one"
    assert replies.text_of(0) == ""


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        ("one two three", 3),
        (["one two", "three"], 3),
        ([1, 2, 3, 4], 4),
        ([{"role": "user", "content": "a b"}, {"role": "system", "content": "c"}], 3),
        ([{"role": "user", "content": [{"type": "text", "text": "a b c d"}]}], 4),
        (None, 0),
    ],
)
def test_prompt_token_counts(prompt: object, tokens: int) -> None:
    assert replies.count_tokens(prompt) == tokens


def test_whole_completions_parse_as_the_sdk_models() -> None:
    chat = ChatCompletion.model_validate(
        replies.chat_completion("chatcmpl-1", 1, "m", "the pool", "length", USE)
    )
    assert chat.choices[0].message.content == "the pool"
    assert chat.usage is not None and chat.usage.total_tokens == 7
    text = Completion.model_validate(
        replies.text_completion("cmpl-1", 1, "m", "the pool", "length", USE)
    )
    assert text.choices[0].text == "the pool"


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_plan(include_usage: bool) -> None:
    plan = replies.stream_plan("chat", "chatcmpl-1", 1, "m", 4, USE, include_usage)
    assert plan.closing[-1] == replies.DONE
    chunks = [
        ChatCompletionChunk.model_validate(event)
        for event in (*plan.opening, *plan.tokens, *plan.closing)
        if isinstance(event, dict)
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        replies.text_of(4)
    )
    assert len(plan.tokens) == 4
    usage = [c.usage for c in chunks if c.usage is not None]
    assert [u.completion_tokens for u in usage] == [4]
    if include_usage:
        assert chunks[-1].choices == []  # OpenAI's separate usage chunk
    else:
        assert chunks[-1].choices[0].finish_reason == "length"


def test_text_stream_plan() -> None:
    plan = replies.stream_plan("text", "cmpl-1", 1, "m", 2, USE, False)
    assert plan.opening == ()
    # OpenAI's own token chunks carry finish_reason null, which the SDK's Completion model
    # only accepts unvalidated (as its stream reader builds them); the finish chunk validates.
    assert "".join(e["choices"][0]["text"] for e in plan.tokens) == "the pool"
    assert {e["choices"][0]["finish_reason"] for e in plan.tokens} == {None}
    finish = Completion.model_validate(plan.closing[0])
    assert finish.choices[0].finish_reason == "length"
    assert finish.usage is not None and finish.usage.completion_tokens == 4
    assert plan.closing[1:] == (replies.DONE,)


def test_embeddings_are_unit_vectors_and_base64_matches_floats() -> None:
    floats = CreateEmbeddingResponse.model_validate(
        replies.embeddings("m", ["a", "b"], 8, "float")
    )
    a, b = (item.embedding for item in floats.data)
    assert len(a) == 8 and a != b
    assert sum(v * v for v in a) == pytest.approx(1.0)
    assert replies.embedding_vector("a", 8) == a
    encoded = replies.embeddings("m", ["a"], 8, "base64")["data"][0]["embedding"]
    decoded = struct.unpack("<8f", base64.b64decode(encoded))
    assert decoded == pytest.approx(a, abs=1e-6)


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("x", ["x"]),
        (["x", "y"], ["x", "y"]),
        ([1, 2], ["1 2"]),
        ([[1, 2], [3]], ["1 2", "3"]),
        ([], None),
        ({"x": 1}, None),
        (["x", 3.5], None),
    ],
)
def test_embedding_inputs(value: object, inputs: list[str] | None) -> None:
    assert replies.embedding_inputs(value) == inputs


def test_proc_locks_parsing_keeps_granted_flocks_only() -> None:
    text = (
        "1: FLOCK  ADVISORY  WRITE 10221 fe:00:9980702 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 10300 fe:00:9980702 0 EOF\n"
        "2: OFDLCK ADVISORY  WRITE -1 fe:00:9979598 0 EOF\n"
        "3: POSIX  ADVISORY  WRITE 77 08:01:12 0 EOF\n"
    )
    assert parse_proc_locks(text) == {(0xFE, 0, 9980702): 10221}
