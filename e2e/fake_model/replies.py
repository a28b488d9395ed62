"""The OpenAI payloads the fake server sends, built without I/O so their shapes are easy to
check: generated words, completion and chunk bodies, usage, error bodies and embeddings.

Shapes follow the OpenAI API closely enough that the official ``openai`` SDK parses them
(chat and text completions, streamed chunks with ``[DONE]``, embeddings as floats or
base64 little-endian float32).
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

JsonObject = dict[str, Any]
FinishReason = Literal["stop", "length"]
Kind = Literal["chat", "text"]
DONE = "[DONE]"

WORDS = (
    "the", "pool", "shares", "one", "GPU", "between", "several", "models", "and", "swaps",
    "them", "on", "demand", "while", "requests", "wait",
)  # fmt: skip
DEFAULT_EMBEDDING_DIMENSIONS = 16


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def token(index: int) -> str:
    """The ``index``-th generated token: a word, with a leading space after the first."""
    word = WORDS[index % len(WORDS)]
    return word if index == 0 else f" {word}"


def text_of(n_tokens: int) -> str:
    return "".join(token(i) for i in range(n_tokens))


def count_tokens(value: object) -> int:
    """A rough token count of a prompt: words in strings, items in token-id lists, found
    recursively in message lists and content parts."""
    return len(prompt_words(value))


def prompt_words(value: object) -> list[str]:
    """The prompt's tokens as `count_tokens` counts them, in order: what a slot caches."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return [str(v) for v in value]
        return [w for v in value for w in prompt_words(v)]
    if isinstance(value, dict):
        return prompt_words(value.get("content")) + prompt_words(value.get("text"))
    return []


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, error_type: str, code: int | str | None = None) -> JsonObject:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def chat_completion(
    response_id: str, created: int, model: str, text: str, finish: FinishReason, use: Usage
) -> JsonObject:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": dict(use),
    }


def text_completion(
    response_id: str, created: int, model: str, text: str, finish: FinishReason, use: Usage
) -> JsonObject:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": dict(use),
    }


def chat_chunk(
    response_id: str,
    created: int,
    model: str,
    delta: JsonObject,
    finish: FinishReason | None = None,
    use: Usage | None = None,
) -> JsonObject:
    chunk: JsonObject = {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None:
        chunk["usage"] = dict(use)
    return chunk


def text_chunk(
    response_id: str,
    created: int,
    model: str,
    text: str,
    finish: FinishReason | None = None,
    use: Usage | None = None,
) -> JsonObject:
    chunk: JsonObject = {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if use is not None:
        chunk["usage"] = dict(use)
    return chunk


def usage_chunk(
    response_id: str, created: int, model: str, object_name: str, use: Usage
) -> JsonObject:
    """The extra last chunk OpenAI sends when ``stream_options.include_usage`` is true."""
    return {
        "id": response_id,
        "object": object_name,
        "created": created,
        "model": model,
        "choices": [],
        "usage": dict(use),
    }


@dataclass(frozen=True)
class StreamPlan:
    """The events of one streamed completion: ``opening`` at once, one of ``tokens`` per
    generated token at the token rate, then ``closing`` (the finish chunk, OpenAI's usage
    chunk when asked for, and ``[DONE]``)."""

    opening: tuple[JsonObject, ...]
    tokens: tuple[JsonObject, ...]
    closing: tuple[JsonObject | str, ...]


def stream_plan(
    kind: Kind,
    response_id: str,
    created: int,
    model: str,
    n_tokens: int,
    use: Usage,
    include_usage: bool,
) -> StreamPlan:
    # Usage rides on the finish chunk (as llama.cpp sends it) unless the client asked for
    # OpenAI's separate usage chunk.
    finish_usage = None if include_usage else use
    if kind == "chat":
        role = {"role": "assistant", "content": ""}
        opening: tuple[JsonObject, ...] = (chat_chunk(response_id, created, model, role),)
        tokens = tuple(
            chat_chunk(response_id, created, model, {"content": token(i)}) for i in range(n_tokens)
        )
        finish = chat_chunk(response_id, created, model, {}, "length", finish_usage)
        object_name = "chat.completion.chunk"
    else:
        opening = ()
        tokens = tuple(text_chunk(response_id, created, model, token(i)) for i in range(n_tokens))
        finish = text_chunk(response_id, created, model, "", "length", finish_usage)
        object_name = "text_completion"
    closing: list[JsonObject | str] = [finish]
    if include_usage:
        closing.append(usage_chunk(response_id, created, model, object_name, use))
    closing.append(DONE)
    return StreamPlan(opening, tokens, tuple(closing))


def embedding_vector(text: str, dimensions: int) -> list[float]:
    """A unit vector that depends only on ``text`` and ``dimensions``."""
    values: list[float] = []
    counter = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        values.extend((byte - 127.5) / 127.5 for byte in digest)
        counter += 1
    values = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def encode_base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embeddings(
    model: str, inputs: list[str], dimensions: int, encoding: Literal["float", "base64"]
) -> JsonObject:
    data: list[JsonObject] = []
    for index, text in enumerate(inputs):
        vector = embedding_vector(text, dimensions)
        data.append(
            {
                "object": "embedding",
                "index": index,
                "embedding": encode_base64(vector) if encoding == "base64" else vector,
            }
        )
    prompt_tokens = sum(count_tokens(text) for text in inputs)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def embedding_inputs(value: object) -> list[str] | None:
    """The request's ``input`` as a list of strings (token-id lists become their decimal
    text), or None when it has no usable shape."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) for v in value):
            return [" ".join(str(v) for v in value)]
        out: list[str] = []
        for item in value:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, list) and all(isinstance(v, int) for v in item):
                out.append(" ".join(str(v) for v in item))
            else:
                return None
        return out
    return None
