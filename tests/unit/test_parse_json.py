"""The router reads a request body with `sidecar.app.parse_json`: the C scanner alone for
the usual body, `json.loads` for any other. Whatever the body, the value or the error is
the one `json.loads` gives."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.app import parse_json

pytestmark = pytest.mark.unit

BODIES = [
    b'{"model":"coder","messages":[{"role":"user","content":"hi"}],"stream":true}',
    b'{"model": "coder", "max_tokens": 1e3, "temperature": -0.5, "stop": null}',
    '{"model": "c\u00f6der", "prompt": "\u65e5\u672c"}'.encode(),
    b'{"model": "\\ud83d\\ude00"}',  # an escaped surrogate pair
    b'{"a": NaN, "b": Infinity}',
    b'[1, 2]',
    b'"just a string"',
    b"7",
    b"{}",
    # whitespace or a BOM around the value: json.loads takes them
    b'  {"model": "coder"}\n',
    b'\xef\xbb\xbf{"model": "coder"}',
    '{"model": "coder"}'.encode("utf-16"),
    '{"model": "coder"}'.encode("utf-16-le"),
    '{"model": "coder"}'.encode("utf-32"),
    # not JSON, or not all of it
    b"",
    b"not json",
    b'{"model": "coder"} {"model": "gemma"}',
    b'{"model": "coder"}x',
    b'{"model": "coder"',
    b'{"model": "co\x00der"}',
    b'{"model": "\xff"}',
    b"\xff\xfe",
    b'{"model": "\xed\xa0\x80"}',  # a lone surrogate, in UTF-8's form
]


def outcome(parse: Callable[[bytes], Any], body: bytes) -> tuple[str, object]:
    try:
        value = parse(body)
    except Exception as e:  # the kind and the message are what is compared
        return type(e).__name__, str(e)
    return "value", json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("body", BODIES)
def test_the_same_as_json_loads(body: bytes) -> None:
    assert outcome(parse_json, body) == outcome(json.loads, body)


def test_the_usual_body_does_not_go_through_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(body: bytes) -> object:
        raise AssertionError("json.loads was called")

    monkeypatch.setattr(json, "loads", refused)
    assert parse_json(BODIES[0]) == {
        "model": "coder", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    value = parse_json(b'{"a": NaN}')
    assert math.isnan(value["a"])


def test_too_deep_is_a_recursion_error_either_way() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(RecursionError):
        json.loads(deep)
    with pytest.raises(RecursionError):
        parse_json(deep)
