"""The payloads of the other APIs llama-server speaks, built without I/O: the OpenAI
Responses API and the Anthropic Messages API (answers and the named events of their
streams), their token counts, tokenize and detokenize, rerank and audio transcription.

Shapes follow what llama-server (the build e2e/llama/build-llama-server.sh makes) answers,
field for field where a client reads them; tests/functional/test_llama_contract.py holds
the fake to the real server for each.
"""

from __future__ import annotations

from dataclasses import dataclass

from e2e.fake_model.replies import JsonObject, token


@dataclass(frozen=True)
class EventPlan:
    """A stream of named events: `opening` at once, one of `tokens` per generated token at
    the token rate, then `closing`."""

    opening: tuple[tuple[str, JsonObject], ...]
    tokens: tuple[tuple[str, JsonObject], ...]
    closing: tuple[tuple[str, JsonObject], ...]


def _text_part(text: str) -> JsonObject:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _message_item(item_id: str, text: str, status: str) -> JsonObject:
    return {"type": "message", "status": status, "id": item_id,
            "content": [_text_part(text)] if status == "completed" else [],
            "role": "assistant"}


def _responses_usage(prompt_tokens: int, output_tokens: int) -> JsonObject:
    return {"input_tokens": prompt_tokens, "output_tokens": output_tokens,
            "total_tokens": prompt_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": 0}}


def response(response_id: str, item_id: str, created: int, model: str, n_tokens: int,
             prompt_tokens: int) -> JsonObject:
    """A whole Responses API answer (`POST /v1/responses`)."""
    text = "".join(token(i) for i in range(n_tokens))
    return {"completed_at": created, "created_at": created, "id": response_id, "model": model,
            "object": "response", "output": [_message_item(item_id, text, "completed")],
            "status": "completed", "usage": _responses_usage(prompt_tokens, n_tokens)}


def response_events(response_id: str, item_id: str, created: int, model: str, n_tokens: int,
                    prompt_tokens: int) -> EventPlan:
    """The events of a streamed Responses API answer, as llama-server sends them."""
    started = {"id": response_id, "object": "response", "status": "in_progress"}
    text = "".join(token(i) for i in range(n_tokens))
    done_item = _message_item(item_id, text, "completed")
    opening = (
        ("response.created", {"type": "response.created", "response": started}),
        ("response.in_progress", {"type": "response.in_progress", "response": started}),
        ("response.output_item.added", {"type": "response.output_item.added",
                                        "item": _message_item(item_id, "", "in_progress")}),
        ("response.content_part.added", {"type": "response.content_part.added",
                                         "item_id": item_id,
                                         "part": {"type": "output_text", "text": ""}}),
    )
    tokens = tuple(
        ("response.output_text.delta", {"type": "response.output_text.delta",
                                        "item_id": item_id, "delta": token(i)})
        for i in range(n_tokens))
    closing = (
        ("response.output_text.done", {"type": "response.output_text.done",
                                       "item_id": item_id, "text": text}),
        ("response.content_part.done", {"type": "response.content_part.done",
                                        "item_id": item_id, "part": _text_part(text)}),
        ("response.output_item.done", {"type": "response.output_item.done", "item": done_item}),
        ("response.completed", {"type": "response.completed", "response": {
            "id": response_id, "object": "response", "created_at": created,
            "status": "completed", "model": model, "output": [done_item],
            "usage": _responses_usage(prompt_tokens, n_tokens)}}),
    )
    return EventPlan(opening, tokens, closing)


def _messages_usage(prompt_tokens: int, output_tokens: int) -> JsonObject:
    return {"cache_read_input_tokens": 0, "input_tokens": prompt_tokens,
            "output_tokens": output_tokens}


def message(message_id: str, model: str, n_tokens: int, prompt_tokens: int) -> JsonObject:
    """A whole Anthropic Messages answer (`POST /v1/messages`)."""
    text = "".join(token(i) for i in range(n_tokens))
    return {"id": message_id, "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}], "model": model,
            "stop_reason": "max_tokens", "stop_sequence": None,
            "usage": _messages_usage(prompt_tokens, n_tokens)}


def message_events(message_id: str, model: str, n_tokens: int,
                   prompt_tokens: int) -> EventPlan:
    """The events of a streamed Messages answer, as llama-server sends them."""
    opening = (
        ("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "content": [],
            "model": model, "stop_reason": None, "stop_sequence": None,
            "usage": _messages_usage(prompt_tokens, 0)}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
    )
    tokens = tuple(
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": token(i)}})
        for i in range(n_tokens))
    closing = (
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                           "usage": {"output_tokens": n_tokens}}),
        ("message_stop", {"type": "message_stop"}),
    )
    return EventPlan(opening, tokens, closing)


def tokens_of(text: str) -> list[int]:
    """Token ids of `text`: one per character, as a byte-level vocabulary would give."""
    return [256 + (ord(c) % 1024) for c in text]


def text_of_tokens(ids: list[int]) -> str:
    return "".join(chr(i - 256) if 256 <= i < 256 + 128 else "?" for i in ids)


def rerank(model: str, query: str, documents: list[str], top_n: int | None) -> JsonObject:
    """llama-server's `/v1/rerank` answer (with `--reranking`): each document's score, the
    share of the query's words it contains, best first."""
    words = set(query.lower().split())
    scored = []
    for index, document in enumerate(documents):
        found = set(document.lower().split())
        scored.append({"index": index,
                       "relevance_score": len(words & found) / len(words) if words else 0.0})
    scored.sort(key=lambda r: -float(r["relevance_score"]))
    tokens = sum(len(d.split()) for d in documents) + len(query.split())
    return {"model": model, "object": "list",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": scored[:top_n] if top_n is not None else scored}


def transcription(model: str, audio_bytes: int) -> JsonObject:
    """An audio transcription's answer: words that say which model heard how much audio."""
    return {"text": f"{model} heard {audio_bytes} bytes of audio"}
