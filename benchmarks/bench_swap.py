"""System benchmark: what a swap costs beyond the model server's own unload and load.

On a local cluster (real control plane, the node agent running pods as processes), with
modelpool installed from overlays/local and fake model servers whose unload and load
times are known, the benchmark sends streamed requests through the router and measures
each one from its arrival to its first byte:

- warm: a pool of two members, one resident; each request asks for the other member, so
  the pool swaps (drain, unload the incumbent, schedule and load the target):
  overhead = time to first byte - (unload time + load time);
- cold: pools with nothing resident (no default member); a request loads the member from
  zero: overhead = time to first byte - load time.

It reports p50, p95, mean and max of the overhead over `--swaps` warm and `--cold` cold
samples, and the mean of the reconciler's swap phases (from its `/metrics`), which say
where the overhead goes. Cold samples need a GPU each (a resident member keeps its GPU),
so the benchmark runs its own cluster with enough fake GPUs, in its own state directory.

    .venv/bin/python benchmarks/bench_swap.py                 # 20 warm + 20 cold
    .venv/bin/python benchmarks/bench_swap.py --swaps 4 --cold 2 --keep   # smoke run
    .venv/bin/python benchmarks/bench_swap.py --write-docs    # also update docs/benchmarks.md

The cluster is taken down at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e import harness  # noqa: E402
from e2e.local import controlplane  # noqa: E402
from e2e.local.demo import Kubectl, metric_samples  # noqa: E402
from e2e.local.paths import default_state_dir  # noqa: E402

DOCS = REPO / "docs" / "benchmarks-log.md"
HEADING = "## Swap overhead (system benchmark, `benchmarks/bench_swap.py`)"
WARM_POOL = "warm"
ROUTER = "bench"
PHASES = ("drain", "unload", "schedule", "load")
# periodSeconds of a member's readiness probe, as templates/model-server renders it
READINESS_PERIOD = 2.0


@dataclass(frozen=True)
class Options:
    state_dir: Path
    swaps: int
    cold: int
    load_time: float
    unload_time: float
    keep: bool
    write_docs: bool


@dataclass(frozen=True)
class Sample:
    kind: str  # warm | cold
    target: str
    first_byte: float
    server_time: float  # the fake server's unload + load for this sample

    @property
    def overhead(self) -> float:
        return self.first_byte - self.server_time


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def summary(samples: Sequence[Sample]) -> dict[str, float]:
    overheads = [s.overhead for s in samples]
    return {
        "n": float(len(overheads)),
        "p50": percentile(overheads, 50),
        "p95": percentile(overheads, 95),
        "mean": statistics.fmean(overheads),
        "max": max(overheads),
        "first_byte_p50": percentile([s.first_byte for s in samples], 50),
    }


def phase_totals(text: str, namespace: str) -> dict[str, tuple[float, float]]:
    """Per phase: (sum of seconds, count) over the namespace's pools."""
    totals: dict[str, tuple[float, float]] = {}
    sums = metric_samples(text, "modelpool_swap_phase_duration_seconds_sum")
    counts = metric_samples(text, "modelpool_swap_phase_duration_seconds_count")
    for labels, value in sums.items():
        d = dict(labels)
        if d.get("namespace") != namespace:
            continue
        phase = d.get("phase", "?")
        seconds, count = totals.get(phase, (0.0, 0.0))
        totals[phase] = (seconds + value, count + counts.get(labels, 0.0))
    return totals


def phase_means(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, float]:
    means: dict[str, float] = {}
    for phase in PHASES:
        s1, c1 = after.get(phase, (0.0, 0.0))
        s0, c0 = before.get(phase, (0.0, 0.0))
        if c1 > c0:
            means[phase] = (s1 - s0) / (c1 - c0)
    return means


def add_phases(
    totals: Mapping[str, tuple[float, float]],
    before: Mapping[str, tuple[float, float]],
    after: Mapping[str, tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """`totals` plus what each phase gained (seconds, count) from `before` to `after`."""
    result = dict(totals)
    for phase in PHASES:
        s1, c1 = after.get(phase, (0.0, 0.0))
        s0, c0 = before.get(phase, (0.0, 0.0))
        seconds, count = result.get(phase, (0.0, 0.0))
        result[phase] = (seconds + s1 - s0, count + c1 - c0)
    return result


def stop_cold_member(kubectl: Kubectl, namespace: str, member: str) -> harness.Pod:
    """Delete `member`'s pool and wait until its pods are gone and the router, whose
    config changed, runs again; return the router's (new) pod."""
    deployment = f"{ROUTER}-router"
    generation = kubectl.json("get", "deployment", deployment, "-n", namespace)["metadata"][
        "generation"]
    kubectl("delete", f"modelpools.{harness.GROUP}", f"cold-{member}", "-n", namespace)
    harness.eventually(
        lambda: True if not harness.member_pods(kubectl, namespace, member) else None,
        f"{member}'s pods gone", 60.0)

    def rolled() -> bool | None:
        obj = kubectl.json("get", "deployment", deployment, "-n", namespace)
        meta, status = obj["metadata"], obj.get("status") or {}
        return True if (meta["generation"] > generation
                        and status.get("observedGeneration") == meta["generation"]) else None

    # The reconciler renders the router's new config into its pod template (a config hash),
    # so the router rolls to a new pod.
    harness.eventually(rolled, "the router's new config rolled out", 60.0)
    (router,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=60.0)
    return router


async def first_byte(session: aiohttp.ClientSession, url: str, model: str) -> float:
    """Seconds from sending a streamed request to the first event of the model's answer;
    reads it to the end. A held stream's comments (": loading ...", sent while the swap
    runs) come before that event and are not counted as it."""
    body = {"model": model, "messages": [{"role": "user", "content": "bench"}],
            "stream": True, "max_tokens": 2}
    start = time.monotonic()
    elapsed = None
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{model}: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if line.startswith(b"data:"):
                elapsed = time.monotonic() - start
                break
        await response.read()
    if elapsed is None:
        raise RuntimeError(f"{model}: the stream ended without an event")
    return elapsed


async def metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        return await response.text()


def fake_member(name: str, options: Options) -> dict[str, Any]:
    return harness.fake_member(
        name, load_time=options.load_time, tokens_per_second=500.0,
        env={"FAKE_MODEL_UNLOAD_TIME": str(options.unload_time)},
    )


def setup(kubectl: Kubectl, namespace: str, options: Options) -> tuple[harness.Pod,
                                                                          harness.Pod]:
    """Install modelpool scoped to `namespace` and the benchmark's pools; return the router
    pod and the reconciler pod."""
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    harness.eventually(
        lambda: True if kubectl("get", "serviceaccount", "default", "-n", namespace,
                                check=False).returncode == 0 else None,
        "the default ServiceAccount", 30.0)
    installation = harness.install(kubectl, scope=namespace)
    reconciler = harness.wait_reconciler_ready(kubectl, installation)
    warm = ["w0", "w1"]
    cold = [f"c{i:02d}" for i in range(options.cold)]
    objects = [fake_member(m, options) for m in warm]
    for m in cold:
        member = fake_member(m, options)
        # Outside its pool (deleted after its sample) a cold member stays stopped.
        member["spec"]["replicas"] = 0
        objects.append(member)
    objects.append(harness.pool(WARM_POOL, warm, default=warm[0], swap_budget="120s"))
    objects += [harness.pool(f"cold-{m}", [m], swap_budget="120s") for m in cold]
    objects.append(harness.router(ROUTER, warm + cold))
    harness.apply(kubectl, namespace, *objects)
    harness.wait_pool_ready(kubectl, namespace, WARM_POOL, resident=warm[0], within=120.0)
    (router,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=120.0)
    return router, reconciler


async def measure(
    kubectl: Kubectl, namespace: str, router: harness.Pod, reconciler: harness.Pod,
    options: Options,
) -> tuple[list[Sample], dict[str, dict[str, float]]]:
    url = f"{harness.base_url(router)}/chat/completions"
    samples: list[Sample] = []
    phases: dict[str, dict[str, float]] = {}
    timeout = aiohttp.ClientTimeout(total=300.0)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        reconciler_metrics = harness.metrics_url(reconciler)
        # One request to the resident first, so the router's connections are open.
        await first_byte(session, url, "w0")
        before = phase_totals(await metrics_text(session, reconciler_metrics), namespace)
        for i in range(options.swaps):
            target = "w1" if i % 2 == 0 else "w0"
            seconds = await first_byte(session, url, target)
            samples.append(Sample("warm", target, seconds,
                                  options.unload_time + options.load_time))
            print(f"warm {i + 1:>2}/{options.swaps} -> {target}: first byte {seconds:.3f}s, "
                  f"overhead {samples[-1].overhead:.3f}s", flush=True)
            # The next swap starts from a settled pool, as a fresh user request would.
            await asyncio.to_thread(harness.wait_pool_ready, kubectl, namespace, WARM_POOL,
                                    target, 60.0)
        after = phase_totals(await metrics_text(session, reconciler_metrics), namespace)
        phases["warm"] = phase_means(before, after)
        before = after
        cold_phases: dict[str, tuple[float, float]] = {}
        for i in range(options.cold):
            target = f"c{i:02d}"
            seconds = await first_byte(session, url, target)
            samples.append(Sample("cold", target, seconds, options.load_time))
            print(f"cold {i + 1:>2}/{options.cold} -> {target}: first byte {seconds:.3f}s, "
                  f"overhead {samples[-1].overhead:.3f}s", flush=True)
            if i == options.cold - 1:
                break
            after = phase_totals(await metrics_text(session, reconciler_metrics), namespace)
            cold_phases = add_phases(cold_phases, before, after)
            # Its pool goes, so the member stops (replicas 0): the next sample meets a node
            # as quiet as this one did, not one more resident process each time.
            router = await asyncio.to_thread(stop_cold_member, kubectl, namespace, target)
            url = f"{harness.base_url(router)}/chat/completions"
            await first_byte(session, url, "w0")  # the new router's connections open
            before = phase_totals(await metrics_text(session, reconciler_metrics), namespace)
        after = phase_totals(await metrics_text(session, reconciler_metrics), namespace)
        cold_phases = add_phases(cold_phases, before, after)
        phases["cold"] = {p: s / c for p, (s, c) in cold_phases.items() if c}
    return samples, phases


def report(samples: Sequence[Sample], phases: Mapping[str, Mapping[str, float]],
           options: Options, command: str, load: tuple[float, float]) -> str:
    lines = [
        HEADING,
        "",
        "Swap overhead = (arrival of a cross-model request at the router to its first byte) "
        "minus (the fake model server's unload time plus load time). Fake servers: load "
        f"{options.load_time:g}s (counted from the process's exec, so it includes Python's "
        f"start-up), unload {options.unload_time:g}s; one streamed request at a time.",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d', time.gmtime())}; the local "
        "testbed (kube-apiserver, etcd, controller manager, scheduler, node agent running pods "
        f"as processes). Load average (1 min) at the start {load[0]:.1f}, at the end "
        f"{load[1]:.1f}: other work on the machine inflates the figures.",
        "",
        "| swaps | n | overhead p50 | p95 | mean | max | first byte p50 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, what in (("warm", "warm (unload + load)"), ("cold", "cold (load from zero)")):
        chosen = [s for s in samples if s.kind == kind]
        if not chosen:
            continue
        s = summary(chosen)
        lines.append(f"| {what} | {s['n']:.0f} | {s['p50']:.2f}s | {s['p95']:.2f}s | "
                     f"{s['mean']:.2f}s | {s['max']:.2f}s | {s['first_byte_p50']:.2f}s |")
    lines += ["", "Mean time per swap phase, from the reconciler's "
              "`modelpool_swap_phase_duration_seconds` (the load phase includes the fake "
              "server's load time; unload includes its unload time):", "",
              "| swaps | " + " | ".join(PHASES) + " |",
              "| --- |" + " --- |" * len(PHASES)]
    for kind, means in phases.items():
        lines.append(f"| {kind} | " + " | ".join(
            f"{means[p]:.2f}s" if p in means else "-" for p in PHASES) + " |")
    warm = phases.get("warm") or {}
    if warm:
        lines += ["", "Where a warm swap's overhead goes (phase means beyond the server's own "
                  f"time): drain {warm.get('drain', 0.0):.2f}s (one idle probe of the "
                  "incumbent, sent as soon as the request is seen), unload "
                  f"{warm.get('unload', 0.0) - options.unload_time:+.2f}s (scale to 0, "
                  "Deployment and ReplicaSet controllers, SIGTERM, the process's exit, the "
                  f"pod object gone), schedule {warm.get('schedule', 0.0):.2f}s (scale-up to "
                  "a pod bound to the node), load "
                  f"{warm.get('load', 0.0) - options.load_time:+.2f}s (bound to Ready as the "
                  "reconciler sees it; the server's load counts from its exec); then the "
                  "router dispatches once the member's EndpointSlice is ready. "
                  "`benchmarks/trace_swap.py` times every hop of this chain."]
    on_time = [s for s in samples if not waited_a_period(s)]
    late = {kind: sum(1 for s in samples if s.kind == kind and waited_a_period(s))
            for kind in ("warm", "cold")}
    lines += ["", f"The readiness probe of a member runs every {READINESS_PERIOD:g} s (the "
              "ModelServer template's `periodSeconds`), counted from the process's start, and "
              f"the fake server is ready {options.load_time:g} s after its exec: the probe's "
              "tick and the load's end race by a few milliseconds, so a sample either sees "
              "the pod Ready at once or one period later. Samples that waited that extra "
              f"period: warm {late['warm']}, cold {late['cold']}; without them, "
              + "; ".join(goal_verdicts(on_time)) + ". A real kubelet probes at an arbitrary "
              "phase of the period, which adds half a period on average; a shorter period "
              "in the template would shrink both."]
    lines += ["", "Goal: at most 0.5 s of overhead (the seeds' system shows about 3 s). "
              + "; ".join(goal_verdicts(samples)) + ".", ""]
    return "\n".join(lines)


def waited_a_period(sample: Sample) -> bool:
    """Whether a sample's pod turned Ready one readiness probe period after its load
    ended (its probe's tick came a moment too early)."""
    return sample.overhead >= READINESS_PERIOD * 0.75


def goal_verdicts(samples: Sequence[Sample], goal: float = 0.5) -> list[str]:
    """Per kind of swap, whether p50 and p95 of the overhead meet the goal."""
    verdicts = []
    for kind in ("warm", "cold"):
        chosen = [s for s in samples if s.kind == kind]
        if not chosen:
            continue
        s = summary(chosen)
        parts = [f"{q} {s[q]:.2f} s ({'met' if s[q] <= goal else 'missed'})"
                 for q in ("p50", "p95")]
        verdicts.append(f"{kind}: " + ", ".join(parts))
    return verdicts


def write_docs(section: str, path: Path = DOCS) -> None:
    """Put `section` into the benchmarks page: replace this benchmark's own section (from
    its heading to the next `## `), or append it; other sections are left as they are.
    Reads the file right before writing, since another benchmark writes there too."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(HEADING)
    if start < 0:
        updated = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(HEADING))
        rest = text[end + 1:] if end >= 0 else ""
        updated = text[:start] + section + ("\n" + rest if rest else "")
    path.write_text(updated.rstrip("\n") + "\n")


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> Options:
    default_dir = default_state_dir(environ, Path.home()).parent / "bench"
    p = argparse.ArgumentParser(prog="bench_swap.py", description=__doc__.split("\n")[0])
    p.add_argument("--state-dir", type=Path, default=default_dir,
                   help=f"the benchmark's own cluster (default: {default_dir})")
    p.add_argument("--swaps", type=int, default=20, help="warm swaps to measure")
    p.add_argument("--cold", type=int, default=20, help="cold loads to measure")
    p.add_argument("--load-time", type=float, default=2.0, help="fake server load seconds")
    p.add_argument("--unload-time", type=float, default=0.5,
                   help="fake server unload seconds")
    p.add_argument("--keep", action="store_true", help="leave the cluster running")
    p.add_argument("--write-docs", action="store_true", help=f"update {DOCS.name}")
    a = p.parse_args(argv)
    return Options(a.state_dir, a.swaps, a.cold, a.load_time, a.unload_time, a.keep,
                   a.write_docs)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    options = parse(args, os.environ)
    command = " ".join([".venv/bin/python", "benchmarks/bench_swap.py", *args])
    cluster = controlplane.up(controlplane.UpOptions(
        state_dir=options.state_dir, python=sys.executable, gpus=options.cold + 2))
    kubectl = Kubectl(cluster.kubeconfig,
                      shutil.which("kubectl") or str(cluster.bin_dir / "kubectl"))
    namespace = f"bench-swap-{secrets.token_hex(3)}"
    load_start = os.getloadavg()[0]
    try:
        router, reconciler = setup(kubectl, namespace, options)
        samples, phases = asyncio.run(measure(kubectl, namespace, router, reconciler, options))
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        harness.uninstall_scope(kubectl, namespace)
        if not options.keep:
            controlplane.down(cluster.state_dir)
    section = report(samples, phases, options, command.replace(" --write-docs", ""),
                     (load_start, os.getloadavg()[0]))
    print("\n" + section)
    print(json.dumps({"samples": [s.__dict__ | {"overhead": s.overhead} for s in samples]}))
    if options.write_docs:
        write_docs(section)
        print(f"wrote the section into {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
