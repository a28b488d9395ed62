"""The JSON-lines log format every program ships: its fields, extras and tracebacks."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from telemetry.logs import JsonFormatter

pytestmark = pytest.mark.unit


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "modelpool.test", logging.WARNING, __file__, 1, "hello %s", ("pool",), None
    )
    record.__dict__.update(extra)
    record.created = 0.0
    return record


def test_a_line_has_time_level_logger_and_message() -> None:
    line = json.loads(JsonFormatter().format(_record()))
    assert line == {
        "time": "1970-01-01T00:00:00.000+00:00",
        "level": "warning",
        "logger": "modelpool.test",
        "message": "hello pool",
    }


def test_extras_become_fields_and_values_json_cannot_hold_become_strings() -> None:
    line = json.loads(JsonFormatter().format(_record(pod="ns/a", path=Path("/x"))))
    assert line["pod"] == "ns/a"
    assert line["path"] == "/x"


def test_a_traceback_comes_as_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in line["exception"]
