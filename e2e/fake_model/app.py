"""The fake server's HTTP surface: an aiohttp application with the OpenAI endpoints, the
Responses and Anthropic Messages APIs, tokenize, rerank and audio transcription, the health
check, llama.cpp's ``/slots`` and ``/props``, and a Prometheus ``/metrics`` whose names
follow the runtime being imitated.

State that the endpoints share (loaded or not, which slots are busy, how many requests
wait) lives in one ``ServerState`` held by the application.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from e2e.fake_model import dialects, kv_slots, replies
from e2e.fake_model.replies import JsonObject
from e2e.fake_model.settings import Mode, Settings

logger = logging.getLogger(__name__)

# (running, waiting) gauge names per imitated runtime.
METRIC_NAMES: dict[Mode, tuple[str, str]] = {
    Mode.VLLM: ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    Mode.LLAMACPP: ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    Mode.OPENAI: ("fake_model_requests_running", "fake_model_requests_waiting"),
}
CONTEXT_SIZE = 4096


class SlotTable:
    """``size`` slots; a request holds one while it generates, the rest wait in order.

    As llama.cpp: a freed slot passes straight to the first waiting request, in the same
    step, so ``/slots`` never reads idle while a request is still waiting for a slot. A
    request may want one slot (``id_slot``; a slot action too): it waits for that one. A
    slot caches its last prompt and generation (``kv_slots``); a request that wants no
    slot takes the free one whose cache shares the longest prefix with its prompt."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = list(range(size))
        self._waiters: collections.deque[tuple[asyncio.Future[int], int | None, bool]] = (
            collections.deque())
        self.busy: set[int] = set()
        # As llama.cpp: every generation is a task with the next id of one counter, and a
        # slot keeps showing the id of its last task once it is done (none before its first).
        self._tasks = 0
        self.task_of: dict[int, int] = {}
        self.served = 0  # generations finished (vLLM's request_success_total)
        self.caches: dict[int, list[str]] = {}
        self.prompt_tokens: dict[int, int] = {}  # of each slot's last prompt

    @property
    def waiting(self) -> int:
        return sum(1 for w, _, _ in self._waiters if not w.done())

    @asynccontextmanager
    async def hold(self, wanted: int | None = None, prompt: Sequence[str] = (),
                   task: bool = True) -> AsyncIterator[int]:
        """A slot for a generation (`task`) or a slot action (not a task: no id, not
        served); `wanted` names the slot, else the one caching most of `prompt`."""
        slot = self._take_free(wanted, prompt)
        if slot is not None:
            self._assign(slot, task)
        else:
            handed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            entry = (handed, wanted, task)
            self._waiters.append(entry)
            try:
                slot = await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():
                    self._release(handed.result())  # handed a slot as it was cancelled
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(entry)
                raise
        try:
            yield slot
        finally:
            if task:
                self.served += 1
            self._release(slot)

    def _take_free(self, wanted: int | None, prompt: Sequence[str]) -> int | None:
        # A free slot is one no waiter could take (a release hands it to the first that
        # can), so a free slot is the newcomer's without jumping the queue.
        if not self._free:
            return None
        if wanted is not None:
            slot = wanted if wanted in self._free else None
        else:
            slot = kv_slots.best_slot(self._free, self.caches, prompt)
            if slot is None:
                slot = min(self._free)
        if slot is not None:
            self._free.remove(slot)
            heapq.heapify(self._free)
        return slot

    def _assign(self, slot: int, task: bool = True) -> None:
        self.busy.add(slot)
        if task:
            self._tasks += 1
            self.task_of[slot] = self._tasks

    def _release(self, slot: int) -> None:
        for entry in list(self._waiters):
            waiter, wanted, task = entry
            if waiter.done():  # a cancelled waiter is skipped
                self._waiters.remove(entry)
                continue
            if wanted is None or wanted == slot:
                self._waiters.remove(entry)
                self._assign(slot, task)  # busy throughout: the next task has it at once
                waiter.set_result(slot)
                return
        self.busy.discard(slot)
        heapq.heappush(self._free, slot)


class ServerState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loaded = False
        self.slots = SlotTable(settings.parallel)
        # A fault a test can switch on: the idle endpoints (/slots, /metrics) answer 500.
        self.idle_probe_fails = False

    async def load(self, already_spent: float = 0.0) -> None:
        """Pretend to load the weights; with ``fail_load`` the load never ends.

        ``already_spent`` is the time the process took to start: the load time counts from
        the process's start, so a server with ``--load-time 5`` is ready 5 s after exec
        whatever its imports cost, and a benchmark can subtract exactly the load time."""
        remaining = max(0.0, self.settings.load_time - already_spent)
        logger.info("loading %s for %.2fs", self.settings.model_id, remaining)
        if self.settings.fail_load:
            logger.warning("FAKE_MODEL_FAIL_LOAD is set: this server will never be ready")
            await asyncio.Event().wait()
        await asyncio.sleep(remaining)
        self.loaded = True
        logger.info("%s loaded, ready", self.settings.model_id)


STATE = web.AppKey("state", ServerState)
REGISTRY = web.AppKey("registry", CollectorRegistry)


def _error(status: int, message: str, error_type: str) -> web.Response:
    return web.json_response(replies.error_body(message, error_type, status), status=status)


def _loading() -> web.Response:
    return _error(503, "Loading model", "unavailable_error")


async def _loaded_body(request: web.Request) -> tuple[ServerState, JsonObject] | web.Response:
    """The server's state and the request's JSON object, or the error to answer instead: a
    body that is no JSON object, or a model not loaded yet."""
    state = request.app[STATE]
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    if not state.loaded:
        return _loading()
    return state, body


async def _json_body(request: web.Request) -> JsonObject | web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "the request body is not valid JSON", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "the request body must be a JSON object", "invalid_request_error")
    return body


def _max_tokens(body: JsonObject, default: int) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _include_usage(body: JsonObject) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


async def _pace(start: float, index: int, tokens_per_second: float) -> None:
    """Wait until token ``index`` is due; deadlines from ``start`` keep the rate exact."""
    loop = asyncio.get_running_loop()
    delay = start + (index + 1) / tokens_per_second - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _sse(payload: JsonObject | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def _completion(request: web.Request, kind: replies.Kind) -> web.StreamResponse:
    loaded = await _loaded_body(request)
    if isinstance(loaded, web.Response):
        return loaded
    state, body = loaded
    settings = state.settings
    n_tokens = _max_tokens(body, settings.max_tokens_default)
    if n_tokens is None:
        return _error(400, "max_tokens must be a non-negative integer", "invalid_request_error")
    prompt = body.get("messages") if kind == "chat" else body.get("prompt")
    if prompt is None:
        field = "messages" if kind == "chat" else "prompt"
        return _error(400, f"'{field}' is required", "invalid_request_error")

    prompt_tokens = replies.count_tokens(prompt)
    if settings.ctx_size is not None:
        # As llama.cpp: the context is shared by the slots; a prompt over one slot's share
        # is a 400, as plain JSON even when the request asked for a stream.
        n_ctx = settings.ctx_size // settings.parallel
        if prompt_tokens >= n_ctx:
            return web.json_response({"error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt_tokens,
                "n_ctx": n_ctx,
            }}, status=400)
    use = replies.usage(prompt_tokens, n_tokens)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    response_id = f"{prefix}-{uuid.uuid4().hex}"
    created = int(time.time())
    model = settings.model_id
    words = replies.prompt_words(prompt)
    wanted = body.get("id_slot")
    if not isinstance(wanted, int) or isinstance(wanted, bool) or not (
            0 <= wanted < state.slots.size):
        wanted = None  # as llama-server: a slot it does not have is no choice
    async with state.slots.hold(wanted, words) as slot:
        table = state.slots
        cached = kv_slots.reuse(table.caches.get(slot, []), words)
        text = replies.text_of(n_tokens)
        table.caches[slot] = words + replies.prompt_words(text)
        table.prompt_tokens[slot] = len(words)
        if body.get("stream") is True:
            plan = replies.stream_plan(
                kind, response_id, created, model, n_tokens, use, _include_usage(body)
            )
            return await _stream(request, settings.tokens_per_second, plan)
        await asyncio.sleep(n_tokens / settings.tokens_per_second)
        build = replies.chat_completion if kind == "chat" else replies.text_completion
        reply = build(response_id, created, model, text, "length", use)
        if settings.mode is Mode.LLAMACPP:
            # As llama-server: how much of the prompt its slot's cache served.
            reply["timings"] = {"cache_n": cached.cache_n, "prompt_n": cached.prompt_n,
                                "predicted_n": n_tokens}
            reply["usage"]["prompt_tokens_details"] = {"cached_tokens": cached.cache_n}
        return web.json_response(reply)


async def _stream(
    request: web.Request, tokens_per_second: float, plan: replies.StreamPlan
) -> web.StreamResponse:
    return await _write_stream(request, tokens_per_second, [_sse(e) for e in plan.opening],
                               [_sse(e) for e in plan.tokens], [_sse(e) for e in plan.closing])


async def _write_stream(request: web.Request, tokens_per_second: float, opening: list[bytes],
                        tokens: list[bytes], closing: list[bytes]) -> web.StreamResponse:
    """`opening` at once, one of `tokens` per token at the token rate, then `closing`."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        for event in opening:
            await response.write(event)
        start = asyncio.get_running_loop().time()
        for index, event in enumerate(tokens):
            await _pace(start, index, tokens_per_second)
            await response.write(event)
        for event in closing:
            await response.write(event)
        await response.write_eof()
    except ConnectionResetError:
        logger.info("client went away during a stream")
    return response


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, "text")


async def embeddings(request: web.Request) -> web.StreamResponse:
    loaded = await _loaded_body(request)
    if isinstance(loaded, web.Response):
        return loaded
    state, body = loaded
    inputs = replies.embedding_inputs(body.get("input"))
    if inputs is None:
        return _error(400, "'input' must be a string or a list of strings", "invalid_request_error")
    dimensions = body.get("dimensions", replies.DEFAULT_EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        return _error(400, "dimensions must be a positive integer", "invalid_request_error")
    encoding: Literal["float", "base64"]
    match body.get("encoding_format") or "float":
        case "float":
            encoding = "float"
        case "base64":
            encoding = "base64"
        case _:
            return _error(400, "encoding_format must be float or base64", "invalid_request_error")
    async with state.slots.hold():
        payload = replies.embeddings(state.settings.model_id, inputs, dimensions, encoding)
    return web.json_response(payload)


def _named_sse(name: str, payload: JsonObject) -> bytes:
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


async def _events(request: web.Request, tokens_per_second: float,
                  plan: dialects.EventPlan) -> web.StreamResponse:
    return await _write_stream(request, tokens_per_second,
                               [_named_sse(n, e) for n, e in plan.opening],
                               [_named_sse(n, e) for n, e in plan.tokens],
                               [_named_sse(n, e) for n, e in plan.closing])


async def responses(request: web.Request) -> web.StreamResponse:
    """The OpenAI Responses API: `input` (a string or a list of items) in, text out."""
    loaded = await _loaded_body(request)
    if isinstance(loaded, web.Response):
        return loaded
    state, body = loaded
    if "input" not in body:
        return _error(400, "'input' is required", "invalid_request_error")
    value = body.get("max_output_tokens")
    n_tokens = state.settings.max_tokens_default if value is None else value
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
        return _error(400, "max_output_tokens must be a non-negative integer",
                      "invalid_request_error")
    prompt_tokens = replies.count_tokens(body.get("input")) + replies.count_tokens(
        body.get("instructions"))
    response_id, item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
    created, model = int(time.time()), state.settings.model_id
    async with state.slots.hold():
        if body.get("stream") is True:
            plan = dialects.response_events(response_id, item_id, created, model, n_tokens,
                                            prompt_tokens)
            return await _events(request, state.settings.tokens_per_second, plan)
        await asyncio.sleep(n_tokens / state.settings.tokens_per_second)
        return web.json_response(dialects.response(response_id, item_id, created, model,
                                                   n_tokens, prompt_tokens))


async def response_input_tokens(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    if "input" not in body:
        return _error(400, "'input' is required", "invalid_request_error")
    return web.json_response({"input_tokens": replies.count_tokens(body.get("input")),
                              "object": "response.input_tokens"})


def _messages_prompt(body: JsonObject) -> int | web.Response:
    """The prompt's token count of a Messages request, or llama-server's error for a body
    with no `messages` (a 500, as it answers)."""
    if "messages" not in body:
        return _error(500, "'messages' is required", "server_error")
    return replies.count_tokens(body.get("messages")) + replies.count_tokens(body.get("system"))


async def messages(request: web.Request) -> web.StreamResponse:
    """The Anthropic Messages API (`anthropic-version` and `anthropic-beta` are accepted and
    not needed, as llama-server does)."""
    loaded = await _loaded_body(request)
    if isinstance(loaded, web.Response):
        return loaded
    state, body = loaded
    prompt_tokens = _messages_prompt(body)
    if isinstance(prompt_tokens, web.Response):
        return prompt_tokens
    n_tokens = _max_tokens(body, state.settings.max_tokens_default)
    if n_tokens is None:
        return _error(400, "max_tokens must be a non-negative integer", "invalid_request_error")
    message_id, model = f"chatcmpl-{uuid.uuid4().hex}", state.settings.model_id
    async with state.slots.hold():
        if body.get("stream") is True:
            plan = dialects.message_events(message_id, model, n_tokens, prompt_tokens)
            return await _events(request, state.settings.tokens_per_second, plan)
        await asyncio.sleep(n_tokens / state.settings.tokens_per_second)
        return web.json_response(dialects.message(message_id, model, n_tokens, prompt_tokens))


async def count_message_tokens(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    prompt_tokens = _messages_prompt(body)
    if isinstance(prompt_tokens, web.Response):
        return prompt_tokens
    return web.json_response({"input_tokens": prompt_tokens})


async def tokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    content = body.get("content")
    if not isinstance(content, str):
        return _error(400, "'content' must be a string", "invalid_request_error")
    return web.json_response({"tokens": dialects.tokens_of(content)})


async def detokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return _error(400, "'tokens' must be a list of integers", "invalid_request_error")
    return web.json_response({"content": dialects.text_of_tokens(ids)})


async def rerank(request: web.Request) -> web.Response:
    loaded = await _loaded_body(request)
    if isinstance(loaded, web.Response):
        return loaded
    state, body = loaded
    query, documents, top_n = body.get("query"), body.get("documents"), body.get("top_n")
    if not isinstance(query, str):
        return _error(400, "'query' must be a string", "invalid_request_error")
    if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        return _error(400, "'documents' must be a list of strings", "invalid_request_error")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)):
        return _error(400, "'top_n' must be an integer", "invalid_request_error")
    async with state.slots.hold():
        return web.json_response(dialects.rerank(state.settings.model_id, query, documents,
                                                 top_n))


async def transcriptions(request: web.Request) -> web.Response:
    """An audio transcription: a multipart form with `file` (and `model`, unread, as a
    single-model server does)."""
    state = request.app[STATE]
    if not state.loaded:
        return _loading()
    try:
        form = await request.post()
    except ValueError:
        return _error(400, "the request body is not a multipart form", "invalid_request_error")
    upload = form.get("file")
    if not isinstance(upload, web.FileField):
        return _error(400, "'file' is required", "invalid_request_error")
    audio = upload.file.read()
    async with state.slots.hold():
        return web.json_response(dialects.transcription(state.settings.model_id, len(audio)))


async def props(request: web.Request) -> web.Response:
    """llama-server's `/props`, the fields a client reads."""
    state = request.app[STATE]
    return web.json_response({
        "default_generation_settings": {"n_ctx": CONTEXT_SIZE},
        "total_slots": state.slots.size,
        "model_alias": state.settings.model_id,
        "model_path": state.settings.model_id,
    })


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    entry = {
        "id": state.settings.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "modelpool-fake-model",
    }
    return web.json_response({"object": "list", "data": [entry]})


async def health(request: web.Request) -> web.Response:
    if not request.app[STATE].loaded:
        return web.json_response({"status": "loading"}, status=503)
    return web.json_response({"status": "ok"})


def _idle_fault() -> web.Response:
    return _error(500, "idle probe fault injected", "server_error")


async def faults(request: web.Request) -> web.Response:
    """``PUT /fake/faults {"idleProbe": "fail" | "ok"}``: a test switch, not an API."""
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    mode = body.get("idleProbe")
    if mode not in ("fail", "ok"):
        return _error(400, "idleProbe must be 'fail' or 'ok'", "invalid_request_error")
    request.app[STATE].idle_probe_fails = mode == "fail"
    logger.warning("idle probe fault %s", "on" if mode == "fail" else "off")
    return web.json_response({"idleProbe": mode})


async def slots(request: web.Request) -> web.Response:
    if request.app[STATE].idle_probe_fails:
        return _idle_fault()
    table = request.app[STATE].slots
    n_ctx = _slot_context(request.app[STATE])
    listed: list[JsonObject] = []
    for slot in range(table.size):
        # each slot's share of --ctx-size, as llama-server lists it
        entry: JsonObject = {"id": slot, "n_ctx": n_ctx, "is_processing": slot in table.busy}
        if slot in table.task_of:
            entry["id_task"] = table.task_of[slot]
            entry["n_prompt_tokens"] = table.prompt_tokens.get(slot, 0)
        listed.append(entry)
    return web.json_response(listed)


def _slot_context(state: ServerState) -> int:
    settings = state.settings
    return settings.ctx_size // settings.parallel if settings.ctx_size else CONTEXT_SIZE


async def slot_action(request: web.Request) -> web.Response:
    """`POST /slots/{id}?action=save|restore|erase` with `{"filename": ...}`, as
    llama-server started with `--slot-save-path` answers it; a busy slot's action waits
    until the slot is free (llama.cpp defers it)."""
    state = request.app[STATE]
    save_path = state.settings.slot_save_path
    if save_path is None:
        return _error(501, "This server does not support slots action. Start it with "
                      "`--slot-save-path`", "not_supported_error")
    try:
        slot = int(request.match_info["id_slot"])
    except ValueError:
        return _error(400, "Invalid slot ID", "invalid_request_error")
    action = request.query.get("action")
    if action not in ("save", "restore", "erase"):
        return _error(400, "Invalid action", "invalid_request_error")
    filename = ""
    if action != "erase":
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        named = body.get("filename")
        if not isinstance(named, str):
            return _error(400, "[json.exception.out_of_range.403] key 'filename' not found",
                          "invalid_request_error")
        if not kv_slots.valid_filename(named):
            return _error(400, "Invalid filename", "invalid_request_error")
        filename = named
    if not 0 <= slot < state.slots.size:
        return _error(400, "Invalid slot ID", "invalid_request_error")
    table, model, n_ctx = state.slots, state.settings.model_id, _slot_context(state)
    started = time.monotonic()
    async with table.hold(slot, task=False):
        if action == "erase":
            n_erased = len(table.caches.pop(slot, []))
            return web.json_response({"id_slot": slot, "n_erased": n_erased})
        path = save_path / filename
        if action == "save":
            tokens = table.caches.get(slot, [])
            data = kv_slots.file_body(model, n_ctx, tokens)
            path.write_bytes(data)
            return web.json_response({
                "id_slot": slot, "filename": filename, "n_saved": len(tokens),
                "n_written": len(data),
                "timings": {"save_ms": round((time.monotonic() - started) * 1000, 3)}})
        restored = kv_slots.read_file(path, model, n_ctx)
        if restored is None:
            table.caches.pop(slot, None)
            return _error(400, f"Unable to restore slot: {kv_slots.INVALID_FILE}",
                          "invalid_request_error")
        table.caches[slot] = restored
        return web.json_response({
            "id_slot": slot, "filename": filename, "n_restored": len(restored),
            "n_read": path.stat().st_size,
            "timings": {"restore_ms": round((time.monotonic() - started) * 1000, 3)}})


async def metrics(request: web.Request) -> web.Response:
    if request.app[STATE].idle_probe_fails:
        return _idle_fault()
    body = generate_latest(request.app[REGISTRY])
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


class _Served(Collector):
    """vLLM's counter of finished requests, `vllm:request_success_total`."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily("vllm:request_success", "Count of successfully processed "
                                     "requests.", labels=["model_name", "finished_reason"])
        family.add_metric([self._state.settings.model_id, "length"], self._state.slots.served)
        yield family


def _registry(state: ServerState) -> CollectorRegistry:
    registry = CollectorRegistry()
    running_name, waiting_name = METRIC_NAMES[state.settings.mode]
    running = Gauge(running_name, "Requests being generated.", ["model_name"], registry=registry)
    waiting = Gauge(waiting_name, "Requests waiting for a slot.", ["model_name"], registry=registry)
    model = state.settings.model_id
    running.labels(model_name=model).set_function(lambda: len(state.slots.busy))
    waiting.labels(model_name=model).set_function(lambda: state.slots.waiting)
    if state.settings.mode is Mode.VLLM:
        registry.register(_Served(state))
    return registry


def build_app(state: ServerState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app[REGISTRY] = _registry(state)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/responses/input_tokens", response_input_tokens)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_message_tokens)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
        app.router.add_post(path, rerank)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_get("/metrics", metrics)
    app.router.add_put("/fake/faults", faults)
    if state.settings.mode is Mode.LLAMACPP:
        app.router.add_get("/slots", slots)
        app.router.add_post("/slots/{id_slot}", slot_action)
        app.router.add_get("/props", props)
    return app
