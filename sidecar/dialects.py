"""The router's own answers in the caller's API dialect.

On the OpenAI paths (chat, completions, embeddings, Responses, and the rest) an error is
`{"error": {"message", "type", "param", "code"}}`; on the Anthropic Messages paths it is
`{"type": "error", "error": {"type", "message"}}` with the type the `anthropic` SDK and the
Anthropic API documentation name for the status. The status itself, and `Retry-After`, are
the same in both. After a held stream's 200 went out, an error is the dialect's stream
event: `data: {"error": ...}` for chat and completions (what the `openai` SDK raises), the
Responses `error` event, and the Messages `event: error`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from sidecar import errors, held_stream
from sidecar.apis import ANTHROPIC, CHAT, RESPONSES, Api, api_of
from sidecar.errors import ProxyError
from sidecar.http.messages import Answer, path_of

# The Anthropic error type of a status; a status not listed takes the type of its class.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    known = _ANTHROPIC_TYPES.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if status < 500 else "api_error"


def error_json(err: ProxyError, api: Api) -> dict[str, object]:
    """The body of `err` as `api`'s clients read it."""
    if api.dialect == ANTHROPIC:
        return {"type": "error",
                "error": {"type": anthropic_type(err.status), "message": err.message}}
    return {"error": {"message": err.message, "type": err.type, "param": err.param,
                      "code": err.code}}


def answer(err: ProxyError, api: Api) -> Answer:
    """`err` as a whole answer in `api`'s dialect: status, headers, JSON body."""
    headers = [("Content-Type", "application/json")]
    if err.retry_after is not None:
        headers.append(("Retry-After", str(max(0, math.ceil(err.retry_after)))))
    return err.status, headers, json.dumps(error_json(err, api)).encode()


def stream_error(err: ProxyError, api: Api) -> bytes:
    """`err` as the last event of a stream whose 200 already went out."""
    if api.dialect == ANTHROPIC:
        return _event("error", error_json(err, api))
    if api.label == "responses":
        return _event("error", {"type": "error", "code": err.code, "message": err.message,
                                "param": err.param, "sequence_number": 0})
    return b"data: " + json.dumps(error_json(err, api)).encode() + b"\n\n"


def _event(name: str, body: dict[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(body).encode() + b"\n\n"


def upstream_error_event(api: Api) -> Callable[[int, bytes], bytes]:
    """How a member's error answer (`status`, `body`) ends a held stream of `api`: the
    member's own words, in the dialect's error event."""
    if api.dialect != ANTHROPIC and api is not RESPONSES:
        return held_stream.upstream_error_event

    def event(status: int, body: bytes) -> bytes:
        return stream_error(_member_error(status, body), api)

    return event


def _member_error(status: int, body: bytes) -> ProxyError:
    """A member's error answer read as the router's: its message where it sent OpenAI's or
    Anthropic's error JSON, else its first words."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = error.get("code")
        return ProxyError(status, error["message"], type=str(error.get("type") or "upstream_error"),
                          code=code if isinstance(code, str) else None)
    text = body[:200].decode("utf-8", "replace")
    return ProxyError(status, f"The backend answered {status}: {text}", type="upstream_error",
                      code="upstream_status")


class _ServerErrors:
    """What the API server answers on its own (`sidecar.http.server.ErrorAnswers`): the
    body over the limit in the dialect its path speaks, the rest (read before a path is
    known, or a failure of the router) in OpenAI's shape."""

    def malformed(self, detail: str) -> Answer:
        return errors.answer(errors.bad_request(f"Malformed HTTP request: {detail}"))

    def too_large(self, limit: int, target: str) -> Answer:
        return answer(errors.body_too_large(limit), api_of(path_of(target)) or CHAT)

    def head_too_large(self, limit: int) -> Answer:
        return errors.answer(errors.head_too_large(limit))

    def request_timeout(self, seconds: float) -> Answer:
        return errors.answer(errors.request_timeout(seconds))

    def internal(self) -> Answer:
        return errors.answer(errors.internal())


SERVER_ERRORS = _ServerErrors()
