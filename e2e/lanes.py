"""The lanes `scripts/test` runs side by side, each a pytest process of its own.

Every test belongs to exactly one lane, by where it runs:

- `host`: tests/unit and tests/functional (processes and sockets on this machine, no
  cluster);
- `local`: tests/integration and the e2e modules that only the local testbed hosts (a
  module-level `TESTBED = "local"`): each lane process starts its own control plane;
- `kind`: e2e/kind_tests and the e2e modules that run on the testbed of this run
  (`e2e.testbeds.chosen()`), which `scripts/test` makes kind.

A test that needs something built beyond what its lane starts with carries
`pytest.mark.build("NAME")` (llama-server, flux, prometheus, registry, argocd):
`--builds=none` leaves it out and `--builds=only` runs only such tests, so a lane starts
while those builds go on and runs them after. Without `--lane` and `--builds`, every test
is selected, as before.

`pytest --lane X` for each lane, once with `--builds=none` and once with `--builds=only`,
selects every collected test exactly once: tests/unit/test_lanes.py holds that.

A lane may run its tests on several pytest-xdist workers (`-n 2 --dist loadfile`), each a
process with a session cluster of its own. A module's tests stay on one worker, so a module
that starts a cluster of its own (`cluster = private_cluster(...)`) starts it once. xdist
hands out the modules in the order collected (`--no-loadscope-reorder`), and a lane collects
them longest first by the seconds each took in the last run (`MODELPOOL_TEST_DURATIONS`, the
table `scripts/test` keeps in the cache): the long ones start early and the lane's two
workers end together rather than one running a long module alone at the end. A module
with no time yet goes first, as the long one it may be; with no table at all, the modules
with the most tests go first (xdist's own order).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from e2e import testbeds
from e2e.local.paths import REPO_ROOT

LANES = ("host", "local", "kind")
HOST_DIRECTORIES = (REPO_ROOT / "tests" / "unit", REPO_ROOT / "tests" / "functional")
E2E_DIRECTORY = REPO_ROOT / "e2e" / "tests"
KIND_DIRECTORY = REPO_ROOT / "e2e" / "kind_tests"
BUILDS = ("none", "only")
DURATIONS = "MODELPOOL_TEST_DURATIONS"
Item = TypeVar("Item", bound=pytest.Item)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lanes", "the lanes scripts/test runs side by side (e2e/lanes.py)")
    group.addoption("--lane", choices=LANES, default=None,
                    help="run only the tests of this lane")
    group.addoption("--builds", choices=BUILDS, default=None,
                    help="none: leave out tests marked build(...); only: run only those")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "build(name): needs the named build (scripts/test runs it after that build)")


def lane_of(path: Path, module_testbed: str | None) -> str:
    """The lane of a test in the file `path`, whose module chose `module_testbed` (its
    `TESTBED`, or None)."""
    resolved = path.resolve()
    if any(resolved.is_relative_to(d) for d in HOST_DIRECTORIES):
        return "host"
    if resolved.is_relative_to(KIND_DIRECTORY):
        return "kind"
    if resolved.is_relative_to(E2E_DIRECTORY):
        return "kind" if testbeds.chosen(module_testbed) == testbeds.KIND else "local"
    return "local"


def selected(item: pytest.Item, lane: str | None, builds: str | None) -> bool:
    if lane is not None:
        module = getattr(item, "module", None)
        if lane_of(Path(str(item.path)), getattr(module, "TESTBED", None)) != lane:
            return False
    if builds is not None:
        needs_build = item.get_closest_marker("build") is not None
        return needs_build == (builds == "only")
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane: str | None = config.getoption("--lane")
    builds: str | None = config.getoption("--builds")
    if lane is None and builds is None:
        return
    keep, drop = partition(items, lane, builds)
    if drop:
        config.hook.pytest_deselected(items=drop)
    table = os.environ.get(DURATIONS)
    items[:] = longest_first(keep, read_durations(Path(table)) if table else {})


def partition(items: Sequence[pytest.Item], lane: str | None,
              builds: str | None) -> tuple[list[pytest.Item], list[pytest.Item]]:
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (keep if selected(item, lane, builds) else drop).append(item)
    return keep, drop


def module_of(nodeid: str) -> str:
    """'e2e.kind_tests.test_kind' for a test of e2e/kind_tests/test_kind.py, as its JUnit
    classname starts (what `scripts/test` times a module by)."""
    return nodeid.split("::", 1)[0].removesuffix(".py").replace("/", ".")


def read_durations(path: Path) -> dict[str, float]:
    """The seconds of each module in a `module<TAB>seconds...` table; {} where there is none
    (a first run) or it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        try:
            seconds[fields[0]] = float(fields[1])
        except (IndexError, ValueError):  # the header, or a line cut short
            continue
    return seconds


def longest_first(items: Sequence[Item], seconds: Mapping[str, float]) -> list[Item]:
    """`items` with their modules longest first by `seconds` (a module with none first of
    all; with no seconds at all, the modules with the most tests first); a module's tests
    keep their order, and so do modules that tie."""
    modules: dict[str, list[Item]] = {}
    for item in items:
        modules.setdefault(module_of(item.nodeid), []).append(item)

    def weight(module: str) -> float:
        if not seconds:
            return float(len(modules[module]))
        return seconds.get(module, float("inf"))

    ordered = sorted(modules, key=lambda m: -weight(m))
    return [item for module in ordered for item in modules[module]]
