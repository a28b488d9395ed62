"""e2e/stages.py, the test command's stages: when a stage may start, its budget, what a
quiet lane reports, and the check that the lanes ran every collected test."""

from __future__ import annotations

import itertools

import pytest

from e2e import stages
from e2e.stages import Budget, Outcome, Stage

pytestmark = pytest.mark.unit


MINUTE = Budget(60, 10)


def stage(name: str, *needs: str, budget: Budget = MINUTE) -> Stage:
    return Stage(name, ("true",), budget, needs)


def outcomes(**states: str) -> dict[str, Outcome]:
    return {name: Outcome(stage(name), state=state) for name, state in states.items()}


@pytest.mark.parametrize(("states", "verdict"), [
    ({}, "go"),
    ({"a": "passed", "b": "passed"}, "go"),
    ({"a": "passed", "b": "running"}, None),
    ({"a": "waiting", "b": "passed"}, None),
    ({"a": "passed", "b": "failed"}, "b failed"),
    ({"a": "not run", "b": "running"}, "a was not run"),
])
def test_a_stage_starts_once_all_it_needs_passed_and_never_after_a_failure(
        states: dict[str, str], verdict: str | None) -> None:
    needs = tuple(states)
    assert stages.ready(stage("x", *needs), outcomes(**states)) == verdict


@pytest.mark.parametrize(("first", "verdict"), [
    ("waiting", None), ("running", None),
    ("passed", "go"), ("failed", "go"), ("not run", "go"),
])
def test_a_stage_after_another_starts_once_it_ended_however_it_ended(
        first: str, verdict: str | None) -> None:
    """A lane's second pytest runs after its first whatever the first found, so one failure
    does not hide the tests behind it."""
    later = Stage("second", ("true",), MINUTE, needs=("build",), after=("first",))
    states = outcomes(first=first, build="passed")
    assert stages.ready(later, states) == verdict
    states["build"].state = "failed"
    assert stages.ready(later, states) == "build failed"


def finished(seconds: float, *, warm: bool, state: str = "passed") -> Outcome:
    return Outcome(stage("build", budget=Budget(cold=300, warm=5)), state=state, started=100.0,
                   ended=100.0 + seconds, warm=warm)


@pytest.mark.parametrize(("seconds", "warm", "over"), [
    (299, False, False), (300, False, False), (301, False, True),
    (5, True, False), (6, True, True),
    (200, True, True),  # a warm stage is held to the warm budget, not the cold one
])
def test_a_stage_is_over_budget_past_the_budget_of_its_kind(seconds: float, warm: bool,
                                                             over: bool) -> None:
    outcome = finished(seconds, warm=warm)
    assert outcome.over_budget() is over
    assert ("WARNING" in stages.budget_note(outcome)) is over


def test_a_stage_not_run_is_never_over_budget() -> None:
    assert not finished(1000, warm=False, state="not run").over_budget()


def test_the_budget_note_names_the_time_and_both_budgets() -> None:
    assert stages.budget_note(finished(301, warm=False)) == (
        "5m01s (cold budget 5m00s, warm 5s) WARNING: over its cold budget")
    assert stages.budget_note(finished(4, warm=True)) == "4s (warm budget 5s, cold 5m00s)"
    same = Outcome(stage("lane", budget=Budget(60, 60)), state="passed", ended=59.0)
    assert stages.budget_note(same) == "59s (budget 1m00s)"


LANE_LOG = """\
............................................ [ 50%]
..............F............................. [100%]
=================================== FAILURES ===================================
___________________________ test_swap ___________________________
E   AssertionError: pool not ready
============================= slowest 15 durations =============================
12.01s call     e2e/kind_tests/test_kind.py::test_swap
=========================== short test summary info ============================
FAILED e2e/kind_tests/test_kind.py::test_swap - AssertionError: pool not ready
============ 1 failed, 87 passed, 2 skipped, 3 deselected in 61.20s ============
"""


def test_a_failed_lane_reports_its_failures_slowest_tests_and_total() -> None:
    shown = stages.report_lines(LANE_LOG, failed=True)
    assert shown[0].strip("= ") == "FAILURES"
    assert "E   AssertionError: pool not ready" in shown
    assert shown[-1].startswith("====") and "1 failed, 87 passed" in shown[-1]
    assert not any(line.startswith("....") for line in shown)


def test_a_passed_lane_reports_its_slowest_tests_and_total_only() -> None:
    shown = stages.report_lines(LANE_LOG.replace("FAILURES", "PASSES"), failed=False)
    assert "E   AssertionError: pool not ready" not in shown
    assert "12.01s call     e2e/kind_tests/test_kind.py::test_swap" in shown
    assert "1 failed, 87 passed" in shown[-1]


def test_a_lane_that_died_before_its_report_shows_its_last_words() -> None:
    assert stages.report_lines("ImportError: no module\n", failed=True) == [
        "ImportError: no module"]


def test_the_lanes_cover_the_suite_when_their_tests_add_up_to_the_collection() -> None:
    collected = "tests/unit/test_x.py::test_a\n\n92 tests collected in 6.26s\n"
    assert stages.ran(LANE_LOG) == 89  # passed and skipped; the failed one ran to no end
    lanes = [LANE_LOG.replace("1 failed, 87", "88"), "==== 2 passed, 9 deselected in 1s ===="]
    assert stages.coverage_gap(collected, lanes) is None
    assert stages.coverage_gap(collected, lanes[:1]) == (
        "the lanes ran 90 tests, but pytest collects 92")
    assert stages.coverage_gap("", lanes) == "the collection printed no total"


def test_a_developers_arguments_run_one_pytest_after_every_build() -> None:
    plan = stages.plan(["-k", "swap"])
    last = plan[-1]
    assert last.argv[-2:] == ("-k", "swap")
    assert set(last.needs) == {s.name for s in plan[:-1]}
    assert not any("--lane" in s.argv for s in plan)


def test_the_builds_run_one_at_a_time() -> None:
    builds = stages.builds()
    for before, after in itertools.pairwise(builds):
        assert after.needs == (before.name,)


def test_module_times_add_up_each_modules_tests_over_every_lane_slowest_first() -> None:
    host = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
    <testcase classname="tests.unit.test_swap" name="test_a" time="1.5" />
    <testcase classname="tests.unit.test_swap.TestDrain" name="test_b" time="2.0" />
    <testcase classname="tests.unit.test_apis" name="test_c" time="0.25" />
    </testsuite></testsuites>"""
    kind = """<testsuites><testsuite name="pytest">
    <testcase classname="e2e.kind_tests.test_kind" name="test_d" time="30.0">
    <failure message="no">...</failure></testcase>
    <testcase classname="tests.unit.test_apis" name="test_e" time="0.5" />
    </testsuite></testsuites>"""
    assert stages.module_times([host, kind, "<testsuites><testsuite"]) == [
        ("e2e.kind_tests.test_kind", 30.0, 1),
        ("tests.unit.test_swap", 3.5, 2),
        ("tests.unit.test_apis", 0.75, 2),
    ]


@pytest.mark.parametrize(("paths", "more", "both"), [
    ("", "/a", "/a"),
    ("/a", "/a:/b", "/a:/b"),
    ("/a:/b", "/a", "/a:/b"),
    ("/a", "/b", "/a:/b"),
])
def test_a_variable_two_stages_export_names_each_path_once_where_it_first_came(
        paths: str, more: str, both: str) -> None:
    assert stages.joined(paths, more) == both


def test_a_folder_short_of_space_is_named_before_the_run_fills_it() -> None:
    gib = 1 << 30
    assert stages.disk_warnings({"/tmp": 20 * gib, "/cache": 9 * gib}) == []
    (warning,) = stages.disk_warnings({"/tmp": 94 * (1 << 20), "/cache": 9 * gib})
    assert warning.startswith("WARNING: /tmp has 0.1 GiB free (a run wants 8 GiB)")
