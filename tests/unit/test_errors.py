"""The error vocabulary: each library error maps to one status, type and code, and every
answer is OpenAI error JSON."""

from __future__ import annotations

import asyncio
import errno
import json
import os

import pytest

from sidecar import errors
from sidecar.http import client as upstream
from sidecar.target import ActivationError

pytestmark = pytest.mark.unit


def _refusal(retry_after: float | None) -> ActivationError:
    return ActivationError("held too long", code="swap_budget_exceeded", retry_after=retry_after)


def _connector_error() -> upstream.ConnectFailed:
    return upstream.ConnectFailed("127.0.0.1:9", ConnectionRefusedError(111, "Connection refused"))


@pytest.mark.parametrize(
    ("exc", "status", "type_", "code", "kind"),
    [
        (_connector_error(), 502, "upstream_error", "upstream_connect_failed", "connect"),
        (
            upstream.ConnectTimedOut(),
            504,
            "upstream_error",
            "upstream_timeout",
            "connect_timeout",
        ),
        (upstream.ReadTimedOut(), 504, "upstream_error", "upstream_timeout", "timeout"),
        (TimeoutError(), 504, "upstream_error", "upstream_timeout", "timeout"),
        (upstream.Disconnected("closed"), 502, "upstream_error", "upstream_failed", "disconnect"),
        (
            upstream.OutOfFiles("127.0.0.1:9", OSError(24, "Too many open files")),
            503,
            "service_unavailable",
            "router_out_of_connections",
            "router_out_of_files",
        ),
        (_refusal(2.1), 503, "service_unavailable", "swap_budget_exceeded", None),
        (ValueError("bug"), 500, "server_error", "internal_error", None),
    ],
)
def test_translate(
    exc: BaseException, status: int, type_: str, code: str, kind: str | None
) -> None:
    err = errors.translate(exc, "coder")
    assert (err.status, err.type, err.code, err.kind) == (status, type_, code, kind)


def test_connect_failures_are_the_ones_reported_to_the_activator() -> None:
    reported = {
        kind
        for kind in ("connect", "connect_timeout", "timeout", "disconnect", "router_out_of_files")
        if errors.is_connect_failure(errors.ProxyError(502, "m", type="t", code="c", kind=kind))
    }
    assert reported == {"connect", "connect_timeout"}


def test_a_proxy_error_translates_to_itself() -> None:
    err = errors.model_not_found("m")
    assert errors.translate(err, "coder") is err


@pytest.mark.parametrize(
    ("retry_after", "header"), [(2.1, "3"), (2.0, "2"), (0.2, "1"), (0.0, "0"), (None, None)]
)
def test_retry_after_is_whole_seconds_rounded_up(
    retry_after: float | None, header: str | None
) -> None:
    status, headers, _ = errors.answer(errors.translate(_refusal(retry_after), "coder"))
    assert status == 503
    assert dict(headers).get("Retry-After") == header


def test_error_body_is_openai_shaped_and_truncates_echoes() -> None:
    err = errors.model_not_found("m" * 1000)
    status, headers, raw = errors.answer(err)
    assert status == 404
    assert dict(headers)["Content-Type"] == "application/json"
    body = json.loads(raw)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == "model"
    assert len(body["error"]["message"]) < 300


@pytest.mark.parametrize(
    ("err", "status", "code"),
    [
        (errors.bad_request("x"), 400, None),
        (errors.unauthorized(), 401, "invalid_api_key"),
        (errors.model_not_found("x"), 404, "model_not_found"),
        (errors.body_too_large(10), 413, "request_too_large"),
    ],
)
def test_client_errors(err: errors.ProxyError, status: int, code: str | None) -> None:
    assert (err.status, err.code, err.type) == (status, code, "invalid_request_error")


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE])
def test_the_routers_own_lack_of_sockets_is_not_an_unreachable_upstream(code: int) -> None:
    """Out of file descriptors, the router cannot connect anywhere: a 503 to retry, and the
    endpoint is not reported dead (that would fail every request held for it)."""

    async def main() -> BaseException:
        loop = asyncio.get_running_loop()

        async def refuse(*args: object, **kwargs: object) -> None:
            raise OSError(code, os.strerror(code))

        loop.create_connection = refuse  # type: ignore[method-assign,assignment]
        client = upstream.Client(connect_timeout=1.0)
        try:
            await client.connect(client.endpoint("http://127.0.0.1:9"))
        except upstream.UpstreamError as e:
            return e
        finally:
            client.close()
        raise AssertionError("connected")

    failure = asyncio.run(main())
    assert isinstance(failure, upstream.OutOfFiles), failure
    err = errors.translate(failure, "coder")
    assert err.status == 503 and err.retry_after == 1.0
    assert not errors.is_connect_failure(err)
