"""The stages of the test command (`scripts/test`): builds and test lanes, side by side.

`scripts/test` installs the Python packages, then runs `python -m e2e.stages [PYTEST ARGS]`.
Each stage is a command that starts once the stages it needs have passed:

    lint                                     (ruff, mypy, and actionlint over the workflows)
    control plane ─ llama-server ─ kind ─ flux ─ prometheus ─ registry ─ argocd  (the builds,
                                     └─ kind b (two workers a lane)   one at a time: each
                                                                      fills both cores)
    host tests ──── host tests needing llama-server                   (at once)
    local tests ─── local tests needing argocd                        (after the control plane)
    kind tests ──── kind tests needing flux, prometheus, registry     (after kind, and kind b)

A test lane is a pytest process of its own (`e2e/lanes.py` says which tests each holds): the
tests that wait on kubelets, controllers and swaps run while the builds and the computing
tests fill the CPUs. On a machine of four cores or more, and on two when the caches are warm
and the CPUs idle (or with MODELPOOL_TEST_WORKERS=2), the two lanes of the testbeds each run
on two pytest-xdist workers with a cluster each: the local lane's workers start a control
plane each, the kind lane's take the two kind clusters (`kind` and `kind b`,
e2e/testbeds.py). With cold caches on two cores the builds fill both CPUs, and on a busy
machine the tests that compute would starve, so there the lanes run on one process each and
`kind b` is not made. A lane's tests that need a later build (`pytest.mark.build`) run once
that build is done: after the lane's first pytest while it is being built, or in that pytest
when it was built before the lane started. With warm caches (every build's output in the
cache: each build a look at it) kind and kind b go beside the other builds instead of before
them, and the host and local lanes wait the few seconds for the builds their late tests need, so
every lane runs in one pytest. Each run keeps its modules' seconds in the cache
(`test-durations.tsv`), and the next run's lanes start their longest modules first
(e2e/lanes.py). With PYTEST ARGS, the builds run first and then one pytest
with those arguments, as a developer asks for.

Every stage has a budget, cold (its caches empty) and warm; a stage that took longer than
its budget is named in a warning where it ends and again in the summary, so the change that
adds minutes is seen where it is made. A stage is warm when its output says so (the build
scripts print `cache warm`, e2e/kind/up.sh `reusing it`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from e2e import lanes
from e2e.local.paths import REPO_ROOT

PYTHON = sys.executable
LANE_ARGS = ("--durations=15", "-p", "no:cacheprovider")
COLLECT = "collect every test"


@dataclass(frozen=True)
class Budget:
    """Seconds a stage may take, with cold caches and with warm ones."""

    cold: float
    warm: float

    def of(self, warm: bool) -> float:
        return self.warm if warm else self.cold


@dataclass(frozen=True)
class Stage:
    name: str
    argv: tuple[str, ...]
    budget: Budget
    needs: tuple[str, ...] = ()
    # Stages that must have ended first, passed or not (a lane's second pytest runs after its
    # first, whatever the first found).
    after: tuple[str, ...] = ()
    # Its output says its caches were warm (None: the same budget either way).
    warm_marker: str | None = None
    # The environment variable its last line of stdout is handed to later stages as.
    exports: str | None = None
    # Niceness: stages off the critical path yield the CPUs to those on it.
    nice: int = 0
    # Its output goes to its log file only, summarised at the end (a pytest lane's dots
    # would interleave with the others').
    quiet: bool = False
    # A pytest given a folder of its own for its temporary files when it starts (short, for
    # the Unix sockets in it; lanes side by side must not share pytest's default one).
    own_basetemp: bool = False
    # A later lane stage whose tests this one runs too when what that stage needs has passed
    # by the time this one starts (a warm run: every build done at once): one pytest, one
    # session's set-up, and on two workers one queue for the whole lane.
    absorbs: str | None = None


@dataclass
class Outcome:
    stage: Stage
    state: str = "waiting"  # waiting, running, passed, failed, not run, merged
    started: float = 0.0
    ended: float = 0.0
    warm: bool = False
    detail: str = ""
    last_line: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def over_budget(self) -> bool:
        return self.state in ("passed", "failed") and self.seconds > self.stage.budget.of(
            self.warm)


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def budget_note(outcome: Outcome) -> str:
    """'5m01s (cold budget 5m00s, warm 5s) WARNING: over its cold budget'."""
    budget = outcome.stage.budget
    kind = "warm" if outcome.warm else "cold"
    if budget.cold == budget.warm:
        note = f"{minutes(outcome.seconds)} (budget {minutes(budget.cold)})"
    else:
        other = "cold" if outcome.warm else "warm"
        note = (f"{minutes(outcome.seconds)} ({kind} budget {minutes(budget.of(outcome.warm))}, "
                f"{other} {minutes(budget.of(not outcome.warm))})")
    if outcome.over_budget():
        note += f" WARNING: over its {kind} budget"
    return note


def ready(stage: Stage, outcomes: Mapping[str, Outcome]) -> str | None:
    """'go' when every stage `stage` needs passed and every stage it comes after ended, a
    reason when one it needs failed or was not run, None while one is still to finish."""
    for need in stage.needs:
        state = outcomes[need].state
        if state in ("failed", "not run"):
            return f"{need} {'failed' if state == 'failed' else 'was not run'}"
    if all(outcomes[n].state in PASSED for n in stage.needs) and all(
            outcomes[a].state in ENDED for a in stage.after):
        return "go"
    return None


PASSED = ("passed", "merged")
ENDED = ("passed", "failed", "not run", "merged")


def absorbing(stage: Stage, later: Stage) -> Stage:
    """`stage` running `later`'s tests as well: its pytest without `--builds none`, and
    both budgets."""
    argv = list(stage.argv)
    at = argv.index("--builds")
    del argv[at:at + 2]
    return replace(stage, argv=tuple(argv), absorbs=None, budget=Budget(
        stage.budget.cold + later.budget.cold, stage.budget.warm + later.budget.warm))


def pytest_stage(name: str, lane: str | None, builds: str | None, needs: tuple[str, ...],
                 budget: Budget, *, after: tuple[str, ...] = (), nice: int = 0,
                 workers: int = 1, absorbs: str | None = None) -> Stage:
    argv = [PYTHON, "-m", "pytest", *LANE_ARGS]
    if workers > 1:
        # pytest-xdist: the lane's tests on `workers` processes, each with its own session
        # cluster, a module's tests on one of them, the modules handed out in the order the
        # lane collects them: longest first (e2e/lanes.py).
        argv += ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]
    if lane is not None:
        argv += ["--lane", lane]
    if builds is not None:
        argv += ["--builds", builds]
    return Stage(name, tuple(argv), budget, needs, after, nice=nice, quiet=True,
                 own_basetemp=True, absorbs=absorbs)


def build(name: str, script: str, budget: Budget, needs: tuple[str, ...], *,
          warm_marker: str = "cache warm", exports: str | None = None, nice: int = 0) -> Stage:
    return Stage(name, ("bash", str(REPO_ROOT / script)), budget, needs,
                 warm_marker=warm_marker, exports=exports, nice=nice)


def cache_root(env: Mapping[str, str]) -> Path:
    """Where the build scripts keep what they built (MODELPOOL_CACHE, as they read it)."""
    if env.get("MODELPOOL_CACHE"):
        return Path(env["MODELPOOL_CACHE"])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".cache")
    return Path(base) / "modelpool"


# What each build leaves in the cache (any version): all there, the builds are warm.
BUILT = ("controlplane/*/bin/kube-apiserver", "llama/*/bin/llama-server", "flux/*/bin/*",
         "prometheus/*/prometheus", "registry/*/registry", "argocd/*/argocd")


def caches_warm(env: Mapping[str, str]) -> bool:
    """The builds are cached and the kind cluster made: what each build script leaves in
    the cache is there, and the kind cluster's kubeconfig."""
    root = cache_root(env)
    kubeconfig = env.get("MODELPOOL_KIND_KUBECONFIG") or str(root / "kind" / "modelpool.kubeconfig")
    return (all(any(root.glob(built)) for built in BUILT)
            and Path(kubeconfig.split(":")[0]).is_file())


def cpu_times() -> tuple[int, int]:
    """The machine's CPU time so far in clock ticks, from /proc/stat: all of it (user, nice,
    system, idle, iowait, irq, softirq and the host's steal) and the idle part."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return sum(fields), fields[3] + fields[4]


def cpu_spare(seconds: float = 2.0) -> float:
    """The share of the CPUs neither busy nor stolen by the host over `seconds`: 1.0 on an
    idle machine, near 0 under a CPU hog or heavy steal."""
    first = cpu_times()
    time.sleep(seconds)  # the span measured, not a wait for anything
    return spare_between(first, cpu_times())


def spare_between(first: tuple[int, int], second: tuple[int, int]) -> float:
    """The idle share of the CPU time between two readings of `cpu_times()` (1.0 when no
    time passed)."""
    total = second[0] - first[0]
    return (second[1] - first[1]) / total if total > 0 else 1.0


# A machine with less of its CPUs spare than this at the start runs one worker a lane.
SPARE_FOR_TWO = 0.6


def lane_workers(env: Mapping[str, str] | None = None, cpus: int | None = None,
                 warm: bool | None = None, spare: float | None = None) -> int:
    """How many pytest-xdist workers each testbed lane runs on: MODELPOOL_TEST_WORKERS when
    set, else 2 on a machine of four cores or more; below, 2 when the caches are warm and
    the CPUs are spare (`spare`, measured when not given, at least SPARE_FOR_TWO), else 1.
    With cold caches the builds fill the CPUs and a second kind cluster would be one more
    build on their way; with warm ones on an idle machine the lanes wait on kubelets and
    swaps more than they compute (1.4 of 2 CPUs busy on one worker a lane,
    docs/benchmarks-log.md); on a machine already busy or losing time to its host, two
    workers a lane would starve the tests that compute."""
    env = os.environ if env is None else env
    chosen = env.get("MODELPOOL_TEST_WORKERS", "").strip()
    if chosen:
        if chosen not in ("1", "2"):
            raise ValueError(f"MODELPOOL_TEST_WORKERS={chosen!r}: expected 1 or 2")
        return int(chosen)
    if ((os.cpu_count() or 1) if cpus is None else cpus) >= 4:
        return 2
    if not (caches_warm(env) if warm is None else warm):
        return 1
    return 2 if (cpu_spare() if spare is None else spare) >= SPARE_FOR_TWO else 1


def builds(workers: int = 1, warm: bool = False) -> list[Stage]:
    """The builds, one after another in the order the lanes want them (each fills the CPUs
    alone; two at once would each take twice as long). Budgets: the cold runs of
    docs/benchmarks-log.md, where the lanes shared the CPUs with them (the cold run of
    2026-12-07 07:13, after Flux and llama-server were made to compile less, the latest),
    with room; warm a few seconds (kind: its images rebuilt).
    With two workers a lane, a second kind cluster, made beside the builds after kind
    (only the kind lane waits for it). With warm caches every build but kind's is a look at
    its cache: kind then goes beside them rather than before, so Flux, Prometheus, the
    registry and Argo CD are there when the lanes start and each lane runs in one pytest."""
    after_kind = "llama-server" if warm else "kind"
    second = [
        # The second cluster for the kind lane's second worker: its node image and the
        # project's images are built already, so it costs a cluster's start and a load.
        # With warm caches both clusters are only looked at, side by side (each up.sh
        # builds nothing and loads only what changed; docker-engine.sh starts one dockerd).
        build("kind b", "e2e/kind/up-second.sh", Budget(420, 150), (after_kind,),
              warm_marker="reusing it", exports="MODELPOOL_KIND_KUBECONFIG"),
    ] if workers > 1 else []
    return [
        build("control plane", "e2e/build-control-plane.sh", Budget(540, 10), ()),
        build("llama-server", "e2e/llama/build-llama-server.sh", Budget(660, 10),
              ("control plane",)),
        # Warm: 24 s with its nodes running; 3 min 28 s where dockerd was down and the
        # nodes of both clusters restarted at once (2026-12-07 11:33).
        build("kind", "e2e/kind/up.sh", Budget(840, 240), ("llama-server",),
              warm_marker="reusing it", exports="MODELPOOL_KIND_KUBECONFIG"),
        *second,
        build("flux", "e2e/flux/build.sh", Budget(600, 10), (after_kind,)),
        build("prometheus", "e2e/prometheus/build.sh", Budget(240, 10), ("flux",)),
        build("registry", "e2e/registry/build.sh", Budget(240, 10), ("prometheus",)),
        build("argocd", "e2e/argocd/build.sh", Budget(450, 10), ("registry",)),
    ]


def lint() -> Stage:
    # Cold: mypy with an empty cache, and actionlint built from the Go module proxy (1 min).
    return Stage("lint", ("bash", str(REPO_ROOT / "scripts" / "lint")), Budget(210, 150))


def plan(pytest_args: Sequence[str], workers: int = 1, warm: bool = False) -> list[Stage]:
    """Every stage of a run: the lanes, or with `pytest_args` one pytest after the builds;
    `workers` pytest-xdist workers for each of the testbeds' lanes. With warm caches the
    host and local lanes also wait for the builds their late tests need (a few seconds:
    each a look at its cache), so that they run them in their one pytest."""
    stages = [lint(), *builds(workers, warm)]
    two = workers > 1
    if pytest_args:
        every_build = tuple(s.name for s in stages)
        return [*stages, Stage("pytest", (PYTHON, "-m", "pytest", *pytest_args),
                               Budget(1800, 1800), every_build)]
    return [
        *stages,
        Stage(COLLECT, (PYTHON, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"),
              Budget(60, 60), quiet=True),
        # The computing tests yield the CPUs to the builds on the way to kind and to the two
        # lanes of the testbeds, the run's longest: they end well before those.
        pytest_stage("host tests", "host", "none", ("llama-server",) if warm else (),
                     Budget(600, 420), nice=15, absorbs="host tests needing builds"),
        pytest_stage("host tests needing builds", "host", "only", ("llama-server",),
                     Budget(240, 240), after=("host tests",), nice=15),
        # On two workers, two control planes: 12 min 34 s beside the kind lane on two cores
        # (2026-12-07 09:45), 13 min 48 s on one (docs/benchmarks-log.md).
        pytest_stage("local tests", "local", "none", ("argocd",) if warm else ("control plane",),
                     Budget(900, 900) if two else Budget(1020, 1020), workers=workers,
                     absorbs="local tests needing builds"),
        pytest_stage("local tests needing builds", "local", "only", ("argocd",),
                     Budget(180, 180), after=("local tests",)),
        # On two workers, two clusters: 12 min 22 s with the tests needing builds, beside the
        # local lane on two cores (2026-12-07 09:45); 13 min 19 s and 3 min 26 s on one.
        pytest_stage("kind tests", "kind", "none", ("kind", "kind b") if two else ("kind",),
                     Budget(660, 660) if two else Budget(840, 840), workers=workers,
                     absorbs="kind tests needing builds"),
        pytest_stage("kind tests needing builds", "kind", "only",
                     ("flux", "prometheus", "registry"), Budget(480, 480), after=("kind tests",)),
    ]


@dataclass
class Run:
    stages: Sequence[Stage]
    log_dir: Path
    base_env: Mapping[str, str]
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    exported: dict[str, str] = field(default_factory=dict)
    begun: float = field(default_factory=time.monotonic)

    def say(self, line: str) -> None:
        clock = time.strftime("%H:%M:%S")
        print(f"[test {clock} +{minutes(time.monotonic() - self.begun)}] {line}",
              file=sys.stderr, flush=True)

    async def go(self) -> bool:
        self.outcomes = {s.name: Outcome(s) for s in self.stages}
        changed = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        while any(o.state in ("waiting", "running") for o in self.outcomes.values()):
            for outcome in self.outcomes.values():
                if outcome.state != "waiting":
                    continue
                verdict = ready(outcome.stage, self.outcomes)
                if verdict == "go":
                    self._absorb(outcome)
                    outcome.state = "running"
                    tasks.add(asyncio.create_task(self._run(outcome, changed)))
                elif verdict is not None:
                    outcome.state, outcome.detail = "not run", verdict
                    self.say(f"{outcome.stage.name}: not run ({verdict})")
                    changed.set()
            if changed.is_set():
                changed.clear()
                continue
            await changed.wait()
            changed.clear()
        await asyncio.gather(*tasks)
        return all(o.state in PASSED for o in self.outcomes.values())

    def _absorb(self, outcome: Outcome) -> None:
        """Where the stage `outcome` is about to run absorbs a later one whose needs have
        all passed, it runs that one's tests too, and the later one is marked merged."""
        name = outcome.stage.absorbs
        if name is None:
            return
        later = self.outcomes[name]
        if later.state != "waiting" or any(
                self.outcomes[n].state not in PASSED for n in later.stage.needs):
            return
        outcome.stage = absorbing(outcome.stage, later.stage)
        later.state, later.detail = "merged", f"its tests ran in {outcome.stage.name}"
        self.say(f"{outcome.stage.name}: with the tests of {name} (what they need is built)")

    async def _run(self, outcome: Outcome, changed: asyncio.Event) -> None:
        stage = outcome.stage
        outcome.started = time.monotonic()
        log_path = self.log_path(stage.name)
        env = {**self.base_env, **self.exported}
        # Line by line into its log, which shows how far a stage has got while it runs.
        env["PYTHONUNBUFFERED"] = "1"
        self.say(f"{stage.name}: started (log {log_path})")
        try:
            code = await self._execute(stage, env, log_path, outcome)
        except Exception as e:  # the stage could not even start: say why, go on
            code, outcome.detail = -1, f"{type(e).__name__}: {e}"
        outcome.ended = time.monotonic()
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        outcome.warm = stage.warm_marker is not None and stage.warm_marker in text
        if code == 0:
            outcome.state = "passed"
            if stage.exports:
                self.exported[stage.exports] = joined(self.exported.get(stage.exports, ""),
                                                      outcome.last_line)
        else:
            outcome.state = "failed"
            outcome.detail = outcome.detail or f"exit {code}"
        if stage.quiet:
            for line in report_lines(text, failed=code != 0):
                self.say(f"{stage.name}: {line}")
        self.say(f"{stage.name}: {outcome.state} in {budget_note(outcome)}")
        changed.set()

    async def _execute(self, stage: Stage, env: Mapping[str, str], log_path: Path,
                       outcome: Outcome) -> int:
        argv = stage.argv
        basetemp = None
        if stage.own_basetemp:
            basetemp = tempfile.mkdtemp(prefix="mp")
            argv = (*argv, f"--basetemp={basetemp}", f"--junitxml={self.report_path(stage.name)}")
        if stage.nice:
            argv = ("nice", "-n", str(stage.nice), *argv)
        with log_path.open("w") as log:
            process = await asyncio.create_subprocess_exec(
                *argv, cwd=REPO_ROOT, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
            try:
                assert process.stdout is not None and process.stderr is not None
                await asyncio.gather(
                    self._pump(stage, process.stdout, log, outcome, stdout=True),
                    self._pump(stage, process.stderr, log, outcome, stdout=False))
                code = await process.wait()
            finally:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, 15)
                    await process.wait()
        if basetemp is not None and code == 0:
            # A lane's temporary files (models, clusters' data: 100 MB and more) go with it;
            # a failed lane's stay for whoever looks into the failure.
            await asyncio.to_thread(shutil.rmtree, basetemp, ignore_errors=True)
        return code

    async def _pump(self, stage: Stage, stream: asyncio.StreamReader, log: TextIO,
                    outcome: Outcome, *, stdout: bool) -> None:
        while raw := await stream.readline():
            line = raw.decode(errors="replace").rstrip("\n")
            log.write(line + "\n")
            if stdout and line.strip():
                outcome.last_line = line.strip()
            if not stage.quiet and not stdout:
                print(f"[{stage.name}] {line}", file=sys.stderr, flush=True)

    def log_path(self, name: str) -> Path:
        return self.log_dir / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".log")

    def report_path(self, name: str) -> Path:
        """A pytest lane's JUnit XML report: every test's time, setup and teardown included."""
        return self.log_path(name).with_suffix(".xml")

    def module_times(self) -> list[tuple[str, float, int]]:
        """(module, seconds, tests) over every lane's JUnit report, slowest first."""
        reports = [p.read_text(errors="replace") for s in self.stages
                   if s.own_basetemp and (p := self.report_path(s.name)).exists()]
        return module_times(reports)

    def slowest_modules(self, rows: Sequence[tuple[str, float, int]],
                        count: int = 15) -> list[str]:
        """The `count` test modules of `rows` that took longest over every lane, written
        in full to `modules.tsv` in the log folder."""
        (self.log_dir / "modules.tsv").write_text(
            "module\tseconds\ttests\n"
            + "".join(f"{m}\t{t:.1f}\t{n}\n" for m, t, n in rows))
        return [f"{t:7.1f}s {n:4d} tests  {m}" for m, t, n in rows[:count]]

    def keep_durations(self, table: Path, rows: Sequence[tuple[str, float, int]]) -> None:
        """This run's seconds of each module (`rows`) into `table` (e2e/lanes.py orders the
        next run's modules by it); a module this run did not time keeps its last seconds. A
        table that cannot be written is said, and the run's verdict stands."""
        try:
            write_durations(table, {**lanes.read_durations(table),
                                    **{m: t for m, t, _ in rows}})
        except OSError as e:
            self.say(f"WARNING: the modules' seconds were not kept in {table}: {e}")

    def log_of(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def lanes_cover_the_suite(self) -> str | None:
        lanes = [s.name for s in self.stages if s.quiet and s.name != COLLECT]
        return coverage_gap(self.log_of(COLLECT), [self.log_of(n) for n in lanes])

    def summary(self) -> list[str]:
        rows = [f"{'stage':<28} {'state':<8} {'start':>7} {'time':>7}  budget"]
        for o in self.outcomes.values():
            start = minutes(o.started - self.begun) if o.started else "-"
            took = minutes(o.seconds) if o.ended else "-"
            budget = o.stage.budget
            note = f"cold {minutes(budget.cold)}, warm {minutes(budget.warm)}"
            if o.ended:
                note = ("warm " if o.warm else "cold ") + minutes(budget.of(o.warm))
                if o.over_budget():
                    note += "  WARNING: over budget"
            detail = f" ({o.detail})" if o.detail else ""
            rows.append(f"{o.stage.name:<28} {o.state:<8} {start:>7} {took:>7}  {note}{detail}")
        return rows


SECTION = re.compile(r"^=+ (.*) =+$")
TOTAL = re.compile(r"\b(passed|failed|errors?|no tests ran)\b")
REPORT_LINES = 3000


def report_lines(text: str, *, failed: bool) -> list[str]:
    """What a quiet pytest lane wrote that matters in the run's own output: its slowest
    tests and its total, and when it failed everything from its first failure on."""
    lines = text.splitlines()
    wanted = ("slowest", "short test summary", *(("FAILURES", "ERRORS") if failed else ()))
    shown: list[str] = []
    section = ""
    for line in lines:
        heading = SECTION.match(line)
        if heading:
            section = heading.group(1)
        if section.startswith(wanted) or (heading and TOTAL.search(section)):
            shown.append(line)
    if failed and not shown:  # it failed before pytest reported anything: its last words
        shown = lines[-60:]
    return shown[-REPORT_LINES:]


COUNTED = re.compile(r"(\d+) (passed|skipped|xfailed|xpassed)\b")
COLLECTED = re.compile(r"^(\d+) tests? collected")


def ran(text: str) -> int:
    """How many tests a pytest run's final line says ran to an end (passed or skipped)."""
    totals = [line for line in text.splitlines() if SECTION.match(line)]
    return sum(int(n) for n, _ in COUNTED.findall(totals[-1])) if totals else 0


def coverage_gap(collected_log: str, lane_logs: Sequence[str]) -> str | None:
    """None when the lanes ran as many tests as one pytest collects, else what differs."""
    found = [int(m.group(1)) for line in collected_log.splitlines()
             if (m := COLLECTED.match(line.strip()))]
    if not found:
        return "the collection printed no total"
    lanes = sum(ran(log) for log in lane_logs)
    if lanes != found[-1]:
        return f"the lanes ran {lanes} tests, but pytest collects {found[-1]}"
    return None


def module_of(classname: str) -> str:
    """'e2e.kind_tests.test_kind' from a JUnit classname ('...test_kind' or
    '...test_kind.TestSwaps')."""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return ".".join(parts[:i + 1])
    return classname


def module_times(reports: Sequence[str]) -> list[tuple[str, float, int]]:
    """(module, seconds, tests) summed over pytest's JUnit XML reports, slowest first."""
    seconds: dict[str, float] = {}
    tests: dict[str, int] = {}
    for report in reports:
        try:
            root = ElementTree.fromstring(report)
        except ElementTree.ParseError:  # a lane killed while writing it: its times are lost
            continue
        for case in root.iter("testcase"):
            module = module_of(case.get("classname", ""))
            seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0.0)
            tests[module] = tests.get(module, 0) + 1
    return sorted(((m, seconds[m], tests[m]) for m in seconds), key=lambda r: -r[1])


# Free space a run wants where it writes: a clean clone's lanes write some 2 GB of temporary
# files and images, a cold run's builds some 20 GB into the cache.
FREE_WANTED = 8 << 30


def disk_warnings(free: Mapping[str, int], wanted: int = FREE_WANTED) -> list[str]:
    """A warning for each folder in `free` (its free bytes) with less than `wanted`: a full
    disk fails tests far from where the space went."""
    return [f"WARNING: {folder} has {space / (1 << 30):.1f} GiB free (a run wants "
            f"{wanted >> 30} GiB): tests that write there will fail"
            for folder, space in free.items() if space < wanted]


def joined(paths: str, more: str) -> str:
    """`paths` and `more`, lists of paths joined by ':' as KUBECONFIG is, as one: each path
    once, where it first came (kind and kind b may end in either order: both name the
    first cluster first)."""
    seen = [p for p in paths.split(os.pathsep) if p]
    seen += [p for p in more.split(os.pathsep) if p and p not in seen]
    return os.pathsep.join(seen)


def write_durations(table: Path, seconds: Mapping[str, float]) -> None:
    """`seconds` as the table e2e/lanes.py reads, longest first; written whole or not at
    all (a lane collecting while it is written reads the old one)."""
    table.parent.mkdir(parents=True, exist_ok=True)
    partial = table.with_name(table.name + ".partial")
    partial.write_text("module\tseconds\n" + "".join(
        f"{m}\t{t:.1f}\n" for m, t in sorted(seconds.items(), key=lambda r: -r[1])))
    partial.replace(table)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m e2e.stages [PYTEST ARGS]`; MODELPOOL_TEST_LOGS names the log folder
    (default: a new temporary one)."""
    pytest_args = list(sys.argv[1:] if argv is None else argv)
    chosen = os.environ.get("MODELPOOL_TEST_LOGS")
    log_dir = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="modelpool-test."))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # e2e/tests run on kind unless a module says otherwise; the lanes depend on it.
    env.setdefault("MODELPOOL_E2E_TESTBED", "kind")
    warm = caches_warm(env)
    workers = lane_workers(env, warm=warm)
    durations = Path(env.setdefault(lanes.DURATIONS,
                                    str(cache_root(env) / "test-durations.tsv")))
    run = Run(plan(pytest_args, workers, warm), log_dir, env)
    run.say(f"logs in {log_dir}; the testbeds' lanes on {workers} worker(s) each"
            f" (MODELPOOL_TEST_WORKERS; caches {'warm' if warm else 'cold'})")
    folders = {tempfile.gettempdir(), str(cache_root(env))}
    for warning in disk_warnings({f: shutil.disk_usage(f).free for f in folders
                                  if Path(f).is_dir()}):
        run.say(warning)
    passed = asyncio.run(run.go())
    if passed and not pytest_args:
        gap = run.lanes_cover_the_suite()
        if gap is not None:
            run.say(f"FAILED: {gap} (e2e/lanes.py must put every test in one lane)")
            passed = False
        else:
            run.say("every collected test ran in one lane")
    if not pytest_args:
        rows = run.module_times()
        run.keep_durations(durations, rows)
        run.say("slowest test modules (every one in modules.tsv in the log folder):")
        for row in run.slowest_modules(rows):
            run.say(row)
    for row in run.summary():
        run.say(row)
    run.say(f"{'passed' if passed else 'FAILED'} in {minutes(time.monotonic() - run.begun)}"
            " (after the Python packages)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
