"""e2e/lanes.py: the lanes scripts/test runs side by side hold every test exactly once."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from e2e import lanes, stages
from e2e.local.paths import REPO_ROOT

pytestmark = pytest.mark.unit

SELECTIONS = list(itertools.product(lanes.LANES, lanes.BUILDS))


@dataclass
class FakeItem:
    """What the lanes read of a collected test."""

    path: Path
    module: SimpleNamespace
    build: str | None

    def get_closest_marker(self, name: str) -> object | None:
        return self.build if name == "build" else None


def item(directory: str, testbed: str | None = None, build: str | None = None) -> FakeItem:
    module = SimpleNamespace() if testbed is None else SimpleNamespace(TESTBED=testbed)
    return FakeItem(REPO_ROOT / directory / "test_x.py", module, build)


@pytest.mark.parametrize(("directory", "testbed", "lane"), [
    ("tests/unit", None, "host"),
    ("tests/functional", None, "host"),
    ("tests/integration", None, "local"),
    ("e2e/tests", None, "kind"),
    ("e2e/tests", "local", "local"),
    ("e2e/kind_tests", None, "kind"),
])
@pytest.mark.parametrize("build", [None, "argocd"])
def test_every_test_is_selected_by_exactly_one_lane_and_phase(
        monkeypatch: pytest.MonkeyPatch, directory: str, testbed: str | None, lane: str,
        build: str | None) -> None:
    monkeypatch.setenv("MODELPOOL_E2E_TESTBED", "kind")
    test = item(directory, testbed, build)
    chosen = [(ln, b) for ln, b in SELECTIONS
              if lanes.selected(test, ln, b)]  # type: ignore[arg-type]
    assert chosen == [(lane, "only" if build else "none")]


def test_without_a_lane_every_test_is_selected() -> None:
    for test in (item("tests/unit"), item("e2e/kind_tests", build="flux")):
        assert lanes.selected(test, None, None)  # type: ignore[arg-type]


def test_the_e2e_suite_follows_the_testbed_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_E2E_TESTBED", "local")
    assert lanes.lane_of(REPO_ROOT / "e2e" / "tests" / "test_x.py", None) == "local"
    monkeypatch.setenv("MODELPOOL_E2E_TESTBED", "kind")
    assert lanes.lane_of(REPO_ROOT / "e2e" / "tests" / "test_x.py", None) == "kind"


BUILD_MARK = re.compile(r"pytest\.mark\.build\(\"([a-z-]+)\"\)")


def needs(plan: list[stages.Stage], name: str) -> set[str]:
    """Every stage `name` waits for, directly or through another."""
    by_name = {s.name: s for s in plan}
    found: set[str] = set()
    todo = list(by_name[name].needs)
    while todo:
        if (need := todo.pop()) not in found:
            found.add(need)
            todo.extend(by_name[need].needs)
    return found


def test_a_test_marked_with_a_build_runs_after_that_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `pytest.mark.build("X")` in the suite names a build stage, and the stage that
    runs the tests of its lane needing builds waits for X."""
    monkeypatch.setenv("MODELPOOL_E2E_TESTBED", "kind")
    plan = stages.plan([])
    stage_of_lane = {s.argv[s.argv.index("--lane") + 1]: s.name for s in plan
                     if "--lane" in s.argv and s.argv[s.argv.index("--builds") + 1] == "only"}
    marked = []
    for directory in ("tests", "e2e/tests", "e2e/kind_tests"):
        for path in sorted((REPO_ROOT / directory).rglob("test_*.py")):
            source = path.read_text()
            testbed = re.search(r'^TESTBED = "(\w+)"', source, re.M)
            for build in BUILD_MARK.findall(source):
                lane = lanes.lane_of(path, testbed.group(1) if testbed else None)
                marked.append((path.name, build))
                assert build in needs(plan, stage_of_lane[lane]), (path, build)
    assert len(marked) >= 4, marked  # llama-server, argocd, flux, prometheus at least


def test_the_testbeds_lanes_run_on_two_workers_a_module_on_one() -> None:
    two = ("local tests", "kind tests")
    for stage in stages.plan([], workers=2):
        if stage.name in two:
            # in the order the lane collects its modules (longest first), not xdist's own
            assert "-n 2 --dist loadfile --no-loadscope-reorder" in " ".join(stage.argv), \
                stage.name
        elif stage.quiet:
            assert "-n" not in stage.argv, stage.name
    kind = next(s for s in stages.plan([], workers=2) if s.name == "kind tests")
    assert kind.needs == ("kind", "kind b")
    # the second cluster is made beside the builds after kind: only the kind lane waits
    assert next(s for s in stages.plan([], workers=2) if s.name == "kind b").needs == ("kind",)
    assert next(s for s in stages.plan([], workers=2) if s.name == "flux").needs == ("kind",)


def test_with_warm_caches_kind_goes_beside_the_builds_and_each_lane_waits_for_its_late_ones(
) -> None:
    warm = {s.name: s for s in stages.plan([], workers=2, warm=True)}
    assert warm["flux"].needs == ("llama-server",)
    assert warm["kind"].needs == ("llama-server",)
    # both clusters only looked at, side by side; the kind lane waits for both
    assert warm["kind b"].needs == ("llama-server",)
    assert warm["local tests"].needs == ("argocd",)
    assert warm["host tests"].needs == ("llama-server",)
    assert warm["kind tests"].needs == ("kind", "kind b")
    cold = {s.name: s for s in stages.plan([], workers=1)}
    assert cold["flux"].needs == ("kind",)
    assert cold["local tests"].needs == ("control plane",)
    assert cold["host tests"].needs == ()


def test_on_one_worker_no_lane_uses_xdist_and_no_second_cluster_is_made() -> None:
    plan = stages.plan([], workers=1)
    assert all("-n" not in s.argv for s in plan)
    assert "kind b" not in [s.name for s in plan]
    assert next(s for s in plan if s.name == "kind tests").needs == ("kind",)
    assert next(s for s in plan if s.name == "flux").needs == ("kind",)


@pytest.mark.parametrize(("env", "cpus", "warm", "spare", "workers"), [
    ({}, 2, False, 1.0, 1), ({}, 2, True, 0.95, 2), ({}, 2, True, 0.6, 2),
    ({}, 2, True, 0.59, 1),  # a CPU hog, or a host's steal: one worker a lane
    ({}, 4, False, 0.0, 2),
    ({"MODELPOOL_TEST_WORKERS": "2"}, 2, False, 0.0, 2),
    ({"MODELPOOL_TEST_WORKERS": "1"}, 16, True, 1.0, 1),
])
def test_two_workers_a_lane_from_four_cores_or_warm_caches_and_spare_cpus_unless_told(
        env: dict[str, str], cpus: int, warm: bool, spare: float, workers: int) -> None:
    assert stages.lane_workers(env, cpus, warm, spare) == workers


@pytest.mark.parametrize(("first", "second", "spare"), [
    ((1000, 900), (1200, 1090), 0.95),  # idle
    ((1000, 900), (1200, 900), 0.0),    # both cores busy (a CPU hog)
    ((1000, 900), (1200, 1000), 0.5),   # half idle, the rest busy or stolen by the host
    ((1000, 900), (1000, 900), 1.0),    # no tick between the readings
])
def test_the_spare_share_is_the_idle_time_between_two_readings(
        first: tuple[int, int], second: tuple[int, int], spare: float) -> None:
    assert stages.spare_between(first, second) == pytest.approx(spare)


def test_the_caches_are_warm_with_every_build_and_a_kind_cluster(tmp_path: Path) -> None:
    env = {"MODELPOOL_CACHE": str(tmp_path)}
    assert not stages.caches_warm(env)
    assert stages.lane_workers(env, 2, spare=1.0) == 1
    (tmp_path / "kind").mkdir()
    (tmp_path / "kind" / "modelpool.kubeconfig").touch()
    for built in stages.BUILT:
        assert not stages.caches_warm(env), built  # not yet every build
        path = tmp_path / built.replace("*", "v1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert stages.caches_warm(env)
    assert stages.lane_workers(env, 2, spare=1.0) == 2
    assert not stages.caches_warm({**env, "MODELPOOL_KIND_KUBECONFIG": str(tmp_path / "none")})


def test_a_worker_count_other_than_one_or_two_is_refused() -> None:
    with pytest.raises(ValueError, match="MODELPOOL_TEST_WORKERS='3'"):
        stages.lane_workers({"MODELPOOL_TEST_WORKERS": "3"}, 2)


@dataclass
class Collected:
    nodeid: str


def collected(*nodeids: str) -> list[Collected]:
    return [Collected(n) for n in nodeids]


def ids(items: list[Collected]) -> list[str]:
    return [i.nodeid for i in items]


def test_a_lane_collects_its_modules_longest_first_by_their_last_seconds() -> None:
    items = collected("e2e/tests/test_a.py::t1", "e2e/tests/test_a.py::t2",
                      "e2e/kind_tests/test_flux.py::t", "e2e/tests/test_b.py::t",
                      "e2e/kind_tests/test_c.py::T::t1", "e2e/kind_tests/test_c.py::T::t2")
    seconds = {"e2e.tests.test_a": 30.0, "e2e.kind_tests.test_flux": 140.0,
               "e2e.tests.test_b": 30.0, "e2e.kind_tests.test_c": 60.0, "gone": 999.0}
    assert ids(lanes.longest_first(items, seconds)) == [  # type: ignore[type-var]
        "e2e/kind_tests/test_flux.py::t",
        "e2e/kind_tests/test_c.py::T::t1", "e2e/kind_tests/test_c.py::T::t2",
        # a tie keeps the order collected; a module's tests keep theirs
        "e2e/tests/test_a.py::t1", "e2e/tests/test_a.py::t2",
        "e2e/tests/test_b.py::t",
    ]


def test_a_module_with_no_time_yet_goes_first_and_with_no_times_the_most_tests_do() -> None:
    items = collected("tests/integration/test_old.py::t",
                      "tests/integration/test_many.py::t1", "tests/integration/test_many.py::t2",
                      "tests/integration/test_new.py::t")
    seconds = {"tests.integration.test_old": 5.0, "tests.integration.test_many": 1.0}
    assert ids(lanes.longest_first(items, seconds)) == [  # type: ignore[type-var]
        "tests/integration/test_new.py::t", "tests/integration/test_old.py::t",
        "tests/integration/test_many.py::t1", "tests/integration/test_many.py::t2"]
    assert ids(lanes.longest_first(items, {})) == [  # type: ignore[type-var]
        "tests/integration/test_many.py::t1", "tests/integration/test_many.py::t2",
        "tests/integration/test_old.py::t", "tests/integration/test_new.py::t"]


def test_the_durations_table_is_read_as_the_run_wrote_it_and_a_missing_one_is_empty(
        tmp_path: Path) -> None:
    table = tmp_path / "cache" / "test-durations.tsv"
    assert lanes.read_durations(table) == {}
    stages.write_durations(table, {"tests.unit.test_swap": 0.25, "e2e.kind_tests.test_flux": 147.5})
    assert table.read_text().splitlines()[:2] == ["module\tseconds",
                                                  "e2e.kind_tests.test_flux\t147.5"]
    assert lanes.read_durations(table) == {"tests.unit.test_swap": 0.2,
                                           "e2e.kind_tests.test_flux": 147.5}
    table.write_text("module\tseconds\ne2e.tests.test_a\t3.0\ncut short\n")
    assert lanes.read_durations(table) == {"e2e.tests.test_a": 3.0}
