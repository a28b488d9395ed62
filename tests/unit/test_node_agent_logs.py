"""The node agent's pod logger: every line names its pod, next to the call's own extras."""

from __future__ import annotations

import json
import logging

import pytest

from e2e.local.node_agent.logs import PodLogger
from telemetry.logs import JsonFormatter

pytestmark = pytest.mark.unit


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


def test_a_pod_logger_names_its_pod_and_keeps_the_calls_extras() -> None:
    logger = logging.getLogger("test.node_agent.logs")
    logger.propagate = False
    lines = _Lines()
    logger.addHandler(lines)
    try:
        PodLogger(logger, {"pod": "ns/a"}).warning("started %s", "x", extra={"restarts": 2})
    finally:
        logger.removeHandler(lines)
    assert len(lines.lines) == 1
    line = lines.lines[0]
    assert (line["message"], line["level"], line["pod"], line["restarts"]) == (
        "started x", "warning", "ns/a", 2
    )
