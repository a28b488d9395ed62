"""A lane on two pytest-xdist workers starts its longest modules first: e2e/lanes.py collects
them longest first by the durations table, and xdist, told `--no-loadscope-reorder` as the
lanes' argv says (e2e/stages.py), hands them out in that order rather than by test count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import lanes, stages
from e2e.local.paths import REPO_ROOT

pytestmark = pytest.mark.functional

# module: (tests, seconds in the last run). By test count xdist would start b and d.
MODULES = {"test_a": (1, 100.0), "test_b": (3, 1.0), "test_c": (1, 50.0), "test_d": (2, 2.0)}


def lane_argv() -> list[str]:
    """The xdist options of the kind lane's pytest on two workers, as the plan has them."""
    (kind,) = [s for s in stages.plan([], workers=2) if s.name == "kind tests"]
    argv = list(kind.argv)
    at = argv.index("-n")
    return argv[at:argv.index("--lane")]


def test_the_longest_modules_start_first_on_two_workers(tmp_path: Path) -> None:
    started = tmp_path / "started"
    for module, (count, _) in MODULES.items():
        tests = "".join(
            f"def test_{i}():\n"
            f"    with open({str(started)!r}, 'a') as f:\n"
            f"        f.write(os.environ['PYTEST_XDIST_WORKER'] + ' {module}\\n')\n"
            for i in range(count))
        (tmp_path / f"{module}.py").write_text(f"import os\n\n{tests}")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    table = tmp_path / "test-durations.tsv"
    stages.write_durations(table, {m: s for m, (_, s) in MODULES.items()})
    argv = lane_argv()
    assert "--no-loadscope-reorder" in argv
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "e2e.lanes",
         "--lane", "local", *argv, "-c", str(tmp_path / "pytest.ini"),
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), lanes.DURATIONS: str(table)})
    assert done.returncode == 0, done.stdout + done.stderr
    first: dict[str, str] = {}
    for line in started.read_text().splitlines():
        worker, module = line.split()
        first.setdefault(worker, module)
    assert sorted(first.values()) == ["test_a", "test_c"], started.read_text()
