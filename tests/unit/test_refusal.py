"""telemetry.refusal: what an error answer of the API server says, whatever its body."""

from __future__ import annotations

import json

import pytest

from telemetry.refusal import Refusal, read_refusal

pytestmark = pytest.mark.unit


def test_a_status_body_gives_its_reason_and_message() -> None:
    message = ('configmaps "x" is forbidden: unable to create new content in namespace t-1 '
               "because it is being terminated")
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
              "reason": "Forbidden", "message": message}
    refusal = read_refusal(403, json.dumps(status).encode())
    assert refusal == Refusal(403, "Forbidden", message)
    assert str(refusal) == f"HTTP 403: {message}"


def test_a_body_that_is_not_a_status_gives_its_start() -> None:
    page = b"<html><body>" + b"x" * 1000 + b"</body></html>"
    refusal = read_refusal(502, page)
    assert (refusal.code, refusal.reason) == (502, "")
    assert refusal.message == page[:300].decode()


@pytest.mark.parametrize("body", [b"", b"{", b'{"message": 7}', b"[1]", b"\xff\xfe"])
def test_an_empty_or_odd_body_still_names_the_status(body: bytes) -> None:
    refusal = read_refusal(401, body)
    assert refusal.code == 401
    assert str(refusal).startswith("HTTP 401")
