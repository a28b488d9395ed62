"""The router's error vocabulary: OpenAI error JSON and one translation from library errors.

Every failure a client can see leaves the router as `{"error": {"message", "type", "param",
"code"}}` with the status the design fixes: 400 bad body (or a garbled request), 401
missing key, 404 unknown model (or path), 405 wrong method, 413 body too large, 500 a
failure of the router itself, 502 upstream refused or broke, 503 (with `Retry-After`) when
activation refuses to hold or the router has no file descriptor left to reach the
upstream (which is then not reported unreachable), 504 upstream timeout. Never 429.
"""

from __future__ import annotations

import json
import math

from sidecar.http.client import ConnectFailed, ConnectTimedOut, OutOfFiles, UpstreamError
from sidecar.http.messages import Answer
from sidecar.target import ActivationError

# How much of an upstream's own words we echo back in a message.
_MAX_ECHO = 200


class ProxyError(Exception):
    """A failure answered to the client; `kind` is set for upstream failures (metrics)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        code: str | None,
        param: str | None = None,
        retry_after: float | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after
        self.kind = kind


def bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, type="invalid_request_error", code=None, param=param)


def unauthorized() -> ProxyError:
    return ProxyError(
        401,
        "Missing or invalid API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
        type="invalid_request_error",
        code="invalid_api_key",
    )


def head_too_large(limit: int) -> ProxyError:
    return ProxyError(
        431,
        f"Request line and headers exceed the router's limit of {limit} bytes.",
        type="invalid_request_error",
        code="request_header_too_large",
    )


def request_timeout(seconds: float) -> ProxyError:
    return ProxyError(
        408,
        f"The request was not received in time: no headers within {seconds:g} s of its"
        f" first byte, or no body byte for {seconds:g} s.",
        type="invalid_request_error",
        code="request_timeout",
    )


def model_not_found(model: str) -> ProxyError:
    return ProxyError(
        404,
        f"The model '{_truncate(model)}' does not exist on this router.",
        type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def not_found(path: str) -> ProxyError:
    return ProxyError(404, f"No such path on this router: {_truncate(path)}",
                      type="invalid_request_error", code="unknown_url")


def method_not_allowed(method: str, path: str) -> ProxyError:
    return ProxyError(405, f"{_truncate(method)} is not allowed on {_truncate(path)}.",
                      type="invalid_request_error", code="method_not_allowed")


def body_too_large(limit: int) -> ProxyError:
    return ProxyError(
        413,
        f"Request body exceeds the router's limit of {limit} bytes.",
        type="invalid_request_error",
        code="request_too_large",
    )


def translate(exc: BaseException, backend: str) -> ProxyError:
    """Map a library error raised while serving `backend` to what the client is told."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, ActivationError):
        return ProxyError(
            exc.status,
            exc.message,
            type="service_unavailable",
            code=exc.code,
            retry_after=exc.retry_after,
        )
    if isinstance(exc, ConnectTimedOut):
        return ProxyError(
            504,
            f"Timed out connecting to backend '{backend}'.",
            type="upstream_error",
            code="upstream_timeout",
            kind="connect_timeout",
        )
    if isinstance(exc, TimeoutError):  # the client's ReadTimedOut among them
        return ProxyError(
            504,
            f"Backend '{backend}' did not answer in time.",
            type="upstream_error",
            code="upstream_timeout",
            kind="timeout",
        )
    if isinstance(exc, OutOfFiles):
        return ProxyError(
            503,
            f"The router has too many connections open to reach backend '{backend}' now.",
            type="service_unavailable",
            code="router_out_of_connections",
            kind="router_out_of_files",
            retry_after=1.0,
        )
    if isinstance(exc, ConnectFailed):
        return ProxyError(
            502,
            f"Cannot connect to backend '{backend}': {_truncate(str(exc.os_error))}",
            type="upstream_error",
            code="upstream_connect_failed",
            kind="connect",
        )
    if isinstance(exc, UpstreamError):
        return ProxyError(
            502,
            f"Backend '{backend}' failed: {_truncate(str(exc) or type(exc).__name__)}",
            type="upstream_error",
            code="upstream_failed",
            kind="disconnect",
        )
    return internal()


def internal() -> ProxyError:
    return ProxyError(500, "Internal router error.", type="server_error", code="internal_error")


def is_connect_failure(err: ProxyError) -> bool:
    """The endpoint could not be reached at all: the activator must re-verify residency."""
    return err.kind in ("connect", "connect_timeout")


def error_body(err: ProxyError) -> dict[str, dict[str, str | None]]:
    return {
        "error": {
            "message": err.message,
            "type": err.type,
            "param": err.param,
            "code": err.code,
        }
    }


def answer(err: ProxyError) -> Answer:
    """`err` as a whole answer: status, headers, JSON body."""
    headers = [("Content-Type", "application/json")]
    if err.retry_after is not None:
        headers.append(("Retry-After", str(max(0, math.ceil(err.retry_after)))))
    return err.status, headers, json.dumps(error_body(err)).encode()


def _truncate(text: str) -> str:
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."
