"""The pure half of the idle probe: which check, and what the answers mean."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.idle import (
    VLLM_RUNNING,
    VLLM_SERVED,
    IdleCheck,
    IdleParseError,
    Method,
    combine,
    idle_check,
    metric_value,
    slots_busy,
)
from reconciler.spec import IdleSpec
from reconciler.swap import Verdict

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("runtime", "idle", "expected"),
    [
        ("llamacpp", None, IdleCheck(Method.SLOTS, "/slots")),
        ("vllm", None, IdleCheck(Method.METRIC, "/metrics", VLLM_RUNNING, 0.0, VLLM_SERVED)),
        ("generic", None, IdleCheck(Method.UNSUPPORTED)),
        ("generic", IdleSpec(path="/idle"), IdleCheck(Method.PATH, "/idle")),
        (
            "generic",
            IdleSpec(metric="inflight", threshold=1),
            IdleCheck(Method.METRIC, "/metrics", "inflight", 1.0),
        ),
        ("generic", IdleSpec(path="/m", metric="q"), IdleCheck(Method.METRIC, "/m", "q", 0.0)),
        ("llamacpp", IdleSpec(path="/idle"), IdleCheck(Method.PATH, "/idle")),
    ],
)
def test_idle_check_follows_runtime_and_spec(
    runtime: str, idle: IdleSpec | None, expected: IdleCheck
) -> None:
    assert idle_check(runtime, idle) == expected


@pytest.mark.parametrize(
    ("body", "busy"),
    [
        ([], False),
        ([{"id": 0, "is_processing": False}], False),
        ([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": True}], True),
    ],
)
def test_slots(body: Any, busy: bool) -> None:
    assert slots_busy(body) is busy


@pytest.mark.parametrize("body", [{}, [{"id": 0}], ["x"], None])
def test_slots_that_make_no_sense_raise(body: Any) -> None:
    with pytest.raises(IdleParseError):
        slots_busy(body)


METRICS = """\
# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2.0
vllm:num_requests_running{model_name="b"} 1.0 1700000000000
vllm:num_requests_waiting{model_name="a"} 5.0
"""


def test_metric_value_sums_label_sets_and_ignores_others() -> None:
    assert metric_value(METRICS, VLLM_RUNNING) == 3.0
    assert metric_value(METRICS, "vllm:num_requests_waiting") == 5.0


@pytest.mark.parametrize("text", ["", "other 1\n", "x NaN\n", "x abc\n"])
def test_a_missing_or_broken_metric_raises(text: str) -> None:
    with pytest.raises(IdleParseError):
        metric_value(text, "x" if text.startswith("x") else VLLM_RUNNING)


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([], Verdict.IDLE),
        ([Verdict.IDLE, Verdict.IDLE], Verdict.IDLE),
        ([Verdict.IDLE, Verdict.FAILED], Verdict.FAILED),
        ([Verdict.FAILED, Verdict.BUSY], Verdict.BUSY),
        ([Verdict.UNSUPPORTED], Verdict.UNSUPPORTED),
    ],
)
def test_combine(verdicts: list[Verdict], expected: Verdict) -> None:
    assert combine(verdicts) is expected
