"""Replays pytest-xdist's `loadfile` scheduler over a test run's JUnit times: how long a
lane's two workers would take with its modules handed out in xdist's own order (most tests
first) and longest first (e2e/lanes.py), each test taking the time that run measured. The
lane's sum over two workers is the floor.

The scheduler as xdist 3.8 has it (`xdist/scheduler/loadscope.py`): one module a worker to
start, then another to each; a worker is handed its next module whenever two tests or fewer
of its own wait, and it starts its last test only once it has a next one or is told to stop
(pytest needs the next test to tear down).

    .venv/bin/python benchmarks/lane_replay.py LOG_FOLDER [LOG_FOLDER ...]

where LOG_FOLDER is a `scripts/test` log folder (MODELPOOL_TEST_LOGS), whose
`local-tests.xml` and `kind-tests.xml` it reads.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e import stages  # noqa: E402

LANES = ("local-tests.xml", "kind-tests.xml")
TESTPATHS = [p.replace("/", ".") + "." for p in tomllib.loads(
    (REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]]


def collected(module: str) -> tuple[int, str]:
    """Where pytest collects `module`: its testpath's place, then by name (xdist breaks a
    tie between modules of as many tests in that order)."""
    at = [i for i, path in enumerate(TESTPATHS) if module.startswith(path)]
    return (at[0] if at else len(TESTPATHS), module)


def modules(report: Path) -> dict[str, list[float]]:
    """Each module's tests' seconds, modules and tests in the report's order."""
    times: dict[str, list[float]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        module = stages.module_of(case.get("classname", ""))
        times.setdefault(module, []).append(float(case.get("time") or 0.0))
    return times


@dataclass
class Worker:
    waiting: list[float] = field(default_factory=list)
    told_to_stop: bool = False
    ended: float = 0.0


def replay(order: Sequence[str], times: dict[str, list[float]], workers: int = 2) -> float:
    """When the last of `workers` ends, the modules handed out in `order`."""
    queue = list(order)
    pool = [Worker() for _ in range(workers)]

    def hand_out(worker: Worker) -> None:
        if worker.told_to_stop:
            return
        if not queue:
            worker.told_to_stop = True
        elif len(worker.waiting) <= 2:
            worker.waiting.extend(times[queue.pop(0)])

    for worker in pool:
        worker.waiting.extend(times[queue.pop(0)] if queue else [])
    for worker in pool:
        hand_out(worker)
    now = 0.0
    running: dict[int, float] = {}
    while True:
        for i, worker in enumerate(pool):
            can_start = len(worker.waiting) >= 2 or (worker.told_to_stop and worker.waiting)
            if i not in running and can_start:
                running[i] = now + worker.waiting[0]
        if not running:
            return max(w.ended for w in pool)
        i = min(running, key=running.__getitem__)
        now = running.pop(i)
        worker = pool[i]
        worker.waiting.pop(0)
        worker.ended = now
        hand_out(worker)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("| run | lane | sum over two | most tests first (xdist) | longest first |")
    print("| --- | --- | --- | --- | --- |")
    for folder in args.folders:
        for lane in LANES:
            report = folder / lane
            if not report.exists():
                continue
            times = modules(report)
            in_order = sorted(times, key=collected)
            most_tests = sorted(in_order, key=lambda m: -len(times[m]))
            longest = sorted(in_order, key=lambda m: -sum(times[m]))
            total = sum(sum(t) for t in times.values())
            print(f"| {folder.name} | {lane.removesuffix('-tests.xml')} | {total / 2:.0f} s | "
                  f"{replay(most_tests, times):.0f} s | {replay(longest, times):.0f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
