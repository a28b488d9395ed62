"""e2e/stages.py runs real processes: stages side by side once what they need passed, a
failure stops what depends on it and nothing else, a stage's last line reaches the stages
after it, and a stage's warm marker picks its budget."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from e2e import lanes, stages
from e2e.stages import Budget, Run, Stage

pytestmark = pytest.mark.functional

ROOMY = Budget(60, 60)


def sh(name: str, script: str, *needs: str, **options: object) -> Stage:
    return Stage(name, ("bash", "-c", script), ROOMY, needs, **options)  # type: ignore[arg-type]


def waits_for(mine: Path, other: Path) -> str:
    """Writes `mine`, then waits up to 30 s for `other`."""
    return (f"touch {mine}; for i in $(seq 300); do [[ -e {other} ]] && exit 0; sleep 0.1; done;"
            " exit 1")


def run(tmp_path: Path, *plan: Stage) -> tuple[bool, Run]:
    done = Run(plan, tmp_path, {"PATH": "/usr/bin:/bin"})
    return asyncio.run(done.go()), done


def test_stages_wait_for_what_they_need_and_pass_on_its_last_line(tmp_path: Path) -> None:
    order = tmp_path / "order"
    passed, done = run(
        tmp_path,
        sh("build", f"echo build >>{order}; echo noise; echo /the/kubeconfig",
           exports="KUBECONFIG_PATH", warm_marker="cache warm"),
        sh("lane", f'echo "lane $KUBECONFIG_PATH" >>{order}', "build"),
    )
    assert passed
    assert order.read_text().splitlines() == ["build", "lane /the/kubeconfig"]
    assert [o.state for o in done.outcomes.values()] == ["passed", "passed"]
    assert not done.outcomes["build"].warm


@pytest.mark.parametrize("second_first", [False, True])
def test_two_clusters_side_by_side_name_both_to_the_lane_whichever_ends_first(
        tmp_path: Path, second_first: bool) -> None:
    """kind prints its kubeconfig, kind b both (the first first): the lane that needs them
    gets both, in that order, whichever ended last."""
    one, two = tmp_path / "one-done", tmp_path / "two-done"
    lane = tmp_path / "lane"
    # the one that ends second waits for the other to have ended
    first_waits = f"for i in $(seq 300); do [[ -e {two} ]] && break; sleep 0.1; done; " \
        if second_first else ""
    second_waits = "" if second_first else \
        f"for i in $(seq 300); do [[ -e {one} ]] && break; sleep 0.1; done; "
    passed, _ = run(
        tmp_path,
        sh("kind", f"{first_waits}echo /a.kubeconfig; touch {one}", exports="KUBECONFIGS"),
        sh("kind b", f"{second_waits}echo /a.kubeconfig:/b.kubeconfig; touch {two}",
           exports="KUBECONFIGS"),
        sh("lane", f'echo "$KUBECONFIGS" >{lane}', "kind", "kind b"),
    )
    assert passed
    assert lane.read_text().strip() == "/a.kubeconfig:/b.kubeconfig"


def test_independent_stages_run_side_by_side(tmp_path: Path) -> None:
    """Each waits for a file the other writes: only together can both finish."""
    a, b = tmp_path / "a", tmp_path / "b"
    passed, _ = run(
        tmp_path,
        sh("one", waits_for(a, b)),
        sh("two", waits_for(b, a)),
    )
    assert passed


def test_a_failure_stops_what_needs_it_and_nothing_else(tmp_path: Path) -> None:
    passed, done = run(
        tmp_path,
        sh("broken", "echo oops >&2; exit 3"),
        sh("after", "exit 0", "broken"),
        sh("after that", "exit 0", "after"),
        sh("aside", "exit 0"),
    )
    assert not passed
    states = {name: (o.state, o.detail) for name, o in done.outcomes.items()}
    assert states == {
        "broken": ("failed", "exit 3"),
        "after": ("not run", "broken failed"),
        "after that": ("not run", "after was not run"),
        "aside": ("passed", ""),
    }
    assert "oops" in (tmp_path / "broken.log").read_text()


def test_a_stage_after_a_failed_one_still_runs(tmp_path: Path) -> None:
    passed, done = run(
        tmp_path,
        sh("first lane", "exit 1"),
        Stage("second lane", ("bash", "-c", "exit 0"), ROOMY, after=("first lane",)),
    )
    assert not passed
    assert [o.state for o in done.outcomes.values()] == ["failed", "passed"]
    assert done.outcomes["second lane"].started >= done.outcomes["first lane"].ended


def test_a_stage_that_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    passed, done = run(tmp_path, Stage("missing", ("/no/such/program",), ROOMY))
    assert not passed
    assert "FileNotFoundError" in done.outcomes["missing"].detail


def test_a_warm_stage_is_held_to_its_warm_budget(tmp_path: Path) -> None:
    passed, done = run(
        tmp_path,
        Stage("warm build", ("bash", "-c", "echo 'cache warm: /x' >&2; sleep 0.3"),
              Budget(cold=60, warm=0.1), warm_marker="cache warm"),
    )
    assert passed
    outcome = done.outcomes["warm build"]
    assert outcome.warm and outcome.over_budget()
    assert any("WARNING: over budget" in row for row in done.summary())


def lane(name: str, *needs: str, after: tuple[str, ...] = (), absorbs: str | None = None,
         record: Path) -> Stage:
    """A stand-in for a pytest lane: writes the arguments it was started with to `record`."""
    return Stage(name, ("bash", "-c", f'echo "{name}: $*" >>{record}', "lane", "--lane", "kind",
                        "--builds", "none" if absorbs else "only"),
                 ROOMY, needs, after, absorbs=absorbs)


def test_a_lane_runs_the_tests_needing_a_build_itself_when_that_build_is_done_first(
        tmp_path: Path) -> None:
    record = tmp_path / "record"
    passed, done = run(
        tmp_path,
        sh("cluster", "true"),
        sh("flux", "true"),
        lane("kind tests", "cluster", "flux", absorbs="kind tests needing builds", record=record),
        lane("kind tests needing builds", "flux", after=("kind tests",), record=record),
    )
    assert passed
    assert record.read_text().splitlines() == ["kind tests: --lane kind"]
    later = done.outcomes["kind tests needing builds"]
    assert (later.state, later.detail) == ("merged", "its tests ran in kind tests")
    assert done.outcomes["kind tests"].stage.budget == Budget(120, 120)


def test_a_lane_leaves_the_tests_needing_a_build_to_run_after_it_while_it_builds(
        tmp_path: Path) -> None:
    record, built = tmp_path / "record", tmp_path / "built"
    passed, done = run(
        tmp_path,
        sh("flux", f"for i in $(seq 300); do [[ -e {record} ]] && break; sleep 0.1; done;"
                   f" touch {built}"),
        lane("kind tests", absorbs="kind tests needing builds", record=record),
        lane("kind tests needing builds", "flux", after=("kind tests",), record=record),
    )
    assert passed and built.exists()
    assert record.read_text().splitlines() == [
        "kind tests: --lane kind --builds none",
        "kind tests needing builds: --lane kind --builds only"]
    assert [o.state for o in done.outcomes.values()] == ["passed"] * 3


@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_lanes_temporary_folder_goes_when_it_passed_and_stays_when_it_failed(
        tmp_path: Path, exit_code: int) -> None:
    # a lane's argv ends in --basetemp=FOLDER --junitxml=FILE: $1 and $2 here
    script = ('folder="${1#--basetemp=}"; mkdir -p "$folder/sub"; touch "$folder/sub/model";'
              f' echo "$folder"; exit {exit_code}')
    lane = Stage("lane", ("bash", "-c", script, "lane"), ROOMY, (), own_basetemp=True)
    passed, done = run(tmp_path, lane)
    assert passed == (exit_code == 0)
    folder = Path(done.outcomes["lane"].last_line)
    assert folder.name.startswith("mp")
    assert folder.exists() == (exit_code != 0)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_modules_seconds_are_kept_for_the_next_run_and_a_table_that_cannot_be_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = ('<testsuites><testsuite name="pytest">'
              '<testcase classname="e2e.kind_tests.test_flux" name="t" time="140.0" />'
              '</testsuite></testsuites>')
    lane = Stage("kind tests", ("bash", "-c", f"cat >\"${{2#--junitxml=}}\" <<'X'\n{report}\nX",
                                "lane"), ROOMY, (), own_basetemp=True)
    passed, done = run(tmp_path, lane)
    assert passed
    table = tmp_path / "cache" / "test-durations.tsv"
    stages.write_durations(table, {"e2e.tests.test_gone": 5.0, "e2e.kind_tests.test_flux": 1.0})
    done.keep_durations(table, done.module_times())
    assert lanes.read_durations(table) == {"e2e.kind_tests.test_flux": 140.0,
                                           "e2e.tests.test_gone": 5.0}
    done.keep_durations(tmp_path / "cache" / "test-durations.tsv" / "not-a-folder",
                        done.module_times())
    assert "WARNING: the modules' seconds were not kept in" in capsys.readouterr().err
