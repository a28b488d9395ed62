"""kubectl's `--watch -o json` output split into whole documents (e2e.harness)."""

from __future__ import annotations

import pytest

from e2e.harness import split_json_stream

pytestmark = pytest.mark.unit


def test_whole_documents_come_out_and_the_partial_one_waits() -> None:
    events, rest = split_json_stream('{"a": 1}\n{\n  "b": [1,\n')
    assert events == [{"a": 1}]
    assert rest == '{\n  "b": [1,\n'
    events, rest = split_json_stream(rest + '2]\n}\n  {"c": 3}')
    assert events == [{"b": [1, 2]}, {"c": 3}]
    assert rest == ""


def test_blank_input_is_nothing() -> None:
    assert split_json_stream("  \n") == ([], "")
