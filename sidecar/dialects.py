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

from sidecar.apis import ANTHROPIC, Api
from sidecar.errors import ProxyError

Header = tuple[str, str]

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


def answer(err: ProxyError, api: Api) -> tuple[int, list[Header], bytes]:
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
