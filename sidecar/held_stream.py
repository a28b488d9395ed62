"""A `stream: true` request held through a swap: its response starts at once and stays
alive.

Idle timeouts of clients, proxies and load balancers (often 60 s) would otherwise cut a
hold that `swapBudget` allows. So once a streamed request has waited `HOLD_NOTICE_AFTER`
for its member, the router answers 200 with `text/event-stream` headers and writes an SSE
comment every `interval` seconds:

    : loading gemma, 12 s, swap phase Loading

SSE parsers, the `openai` and `anthropic` SDKs' among them, skip comment lines. With the
router config's `heldStreamProgress: content` (the ModelRouter's
`spec.proxy.heldStreamProgress: Content`, for chat UIs) the same words are a visible delta
instead, on the chat and text completion streams. When the member is ready, the upstream's
events follow in the same response. A failure after the headers went out (the swap
abandoned, the upstream's own error answer) arrives as one error event in the dialect of
the API the request speaks (`sidecar.dialects`): `data: {"error": {...}}` for chat and
completions, which the `openai` SDK raises as an `APIError`, the Responses `error` event,
the Messages `event: error`; and the stream ends. Requests that are not streamed are held
as before, with no early answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from sidecar.http.messages import Reply, Request

# A member that answers within this is not held: its stream starts as the upstream's does.
HOLD_NOTICE_AFTER = 0.1

T = TypeVar("T")


def sse_event(body: Mapping[str, object]) -> bytes:
    """`body` as one server-sent event."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def upstream_error_event(status: int, body: bytes) -> bytes:
    """The upstream's error answer (`status`, `body`) as the last event of a stream that
    already started: its own OpenAI error JSON if it sent one, else one that quotes it."""
    try:
        error = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
        error = None
    if not (isinstance(error, dict) and isinstance(error.get("error"), dict)):
        text = body[:200].decode("utf-8", "replace")
        error = {"error": {"message": f"The backend answered {status}: {text}",
                           "type": "upstream_error", "param": None, "code": "upstream_status"}}
    return sse_event(error)


class HeldStream:
    """The early response of one streamed request, once it is held."""

    def __init__(self, request: Request, reply: Reply, what: str, interval: float,
                 progress: Callable[[], str], *, as_content: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self._request = request
        self._reply = reply
        self._what = what
        self._interval = interval
        self._progress = progress
        self._as_content = as_content
        self._clock = clock

    @property
    def started(self) -> bool:
        """Whether the early answer went out: the upstream's events continue it."""
        return self._reply.started

    async def hold(self, lease: AbstractAsyncContextManager[T]) -> T:
        """Enter `lease` (the activator's), keeping the stream alive while it waits. Left
        again if the client goes just as it was entered: the caller never saw it."""
        task = asyncio.ensure_future(lease.__aenter__())
        try:
            done, _ = await asyncio.wait({task}, timeout=HOLD_NOTICE_AFTER)
            since = self._clock()
            while not done:
                await self._comment(since)
                done, _ = await asyncio.wait({task}, timeout=self._interval)
            return task.result()
        except BaseException:
            if task.done() and not task.cancelled() and task.exception() is None:
                await lease.__aexit__(None, None, None)
            else:
                task.cancel()
            raise

    async def _comment(self, since: float) -> None:
        if not self._reply.started:
            await self._reply.start(200, (
                ("Content-Type", "text/event-stream"),
                ("Cache-Control", "no-cache"),
                ("X-Accel-Buffering", "no"),  # nginx in front: pass the comments on at once
                ("X-Modelpool-Backend", self._what),  # sidecar.fallback.ANSWERED_BY
            ))
        waited = self._clock() - since + HOLD_NOTICE_AFTER
        text = f"loading {self._what}, {waited:.0f} s, {self._progress()}"
        if self._as_content:
            await self._reply.write(self._delta(text + "\n"))
        else:
            await self._reply.write(f": {text}\n\n".encode())

    def _delta(self, text: str) -> bytes:
        """`text` as a visible chunk of the kind the request streams (chat or text)."""
        created = int(time.time())
        if self._request.path.endswith("/chat/completions"):
            chunk: dict[str, object] = {
                "id": "modelpool-hold", "object": "chat.completion.chunk", "created": created,
                "model": self._what,
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        else:
            chunk = {"id": "modelpool-hold", "object": "text_completion", "created": created,
                     "model": self._what,
                     "choices": [{"index": 0, "text": text, "finish_reason": None}]}
        return sse_event(chunk)

    async def end_with(self, event: bytes) -> None:
        """End the started stream with `event` (an error, in the dialect of the API the
        request speaks: `sidecar.dialects.stream_error`) as its last event."""
        with contextlib.suppress(ConnectionError):  # a client gone has nothing left to hear
            await self._reply.end(event)
