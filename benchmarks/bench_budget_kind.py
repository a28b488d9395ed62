"""System benchmark on kind: one trace of requests over three models, replayed through the
router against the same members as an exclusive pool and as a pool with a memory budget,
in one run.

The members are fake model servers whose load takes `--load` seconds (the cold load a
real runtime pays; on real hardware 30 to 90 s for models of 20 GB and more) and request
no GPU (sharing is the budget's job in the budgeted pool: docs/api.md). Footprints: a 8
GiB, b 6 GiB, c 10 GiB in a 16 GiB budget, so a and b fit together and c fits beside b
alone. The trace (seeded) sends most requests to a and b, some to c, at exponential
arrival times; each request is a short stream, timed from sending to its first event
(time to first token, a held request's wait included).

Printed per pool: loads (every member loaded), unloads forced by a load (the exclusive
pool's swaps, the budgeted pool's evictions), time to first token p50 and p95, and the
requests the router held; then the budgeted pool's figures as ratios of the exclusive
pool's. Goal: no unload between members that fit together, and at least 3 times fewer
swaps and a 3 times lower p95 than the exclusive pool.

    .venv/bin/python benchmarks/bench_budget_kind.py --requests 60 --rate 0.5 --load 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import bench_swap  # noqa: E402
from benchmarks.bench_swap_kind import CONTROL_PLANE, kubeconfig  # noqa: E402
from e2e import harness  # noqa: E402
from e2e.local.fixtures import Kubectl  # noqa: E402

FOOTPRINTS = {"a": "8Gi", "b": "6Gi", "c": "10Gi"}
SHARES = {"a": 0.45, "b": 0.45, "c": 0.10}


@dataclass
class Outcome:
    pool: str
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    loads: float = 0.0
    unloads: float = 0.0
    held: float = 0.0


def trace(n: int, rate: float, seed: int) -> list[tuple[float, str]]:
    """(arrival second, model) of `n` requests."""
    rng = random.Random(seed)
    at, out = 0.0, []
    models, weights = list(SHARES), list(SHARES.values())
    for _ in range(n):
        at += rng.expovariate(rate)
        out.append((at, rng.choices(models, weights)[0]))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def namespace(kubectl: Kubectl, name: str) -> None:
    kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", check=False,
            timeout=120)
    kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted"}}}))
    harness.eventually(lambda: True if kubectl("get", "serviceaccount", "default", "-n", name,
                                               check=False).returncode == 0 else None,
                       f"namespace {name}'s default ServiceAccount", 30)


def set_up(kubectl: Kubectl, ns: str, budgeted: bool, load: float) -> harness.Pod:
    members = []
    for name in FOOTPRINTS:
        server = harness.fake_member(name, load_time=load, gpu=0, scratch=False)
        members.append(server)
    extra = {"gpuMemory": "16Gi"} if budgeted else {}
    pool = harness.pool("p", list(FOOTPRINTS), default="a", swap_budget="120s", **extra)
    if budgeted:
        for entry in pool["spec"]["members"]:
            entry["gpuMemory"] = FOOTPRINTS[entry["name"]]
    router = harness.router_on_node(harness.router("r", list(FOOTPRINTS)), CONTROL_PLANE)
    harness.apply(kubectl, ns, *members, pool, router)
    (pod,) = harness.wait_router_ready(kubectl, ns, "r", None, 180.0)
    harness.wait_pool_ready(kubectl, ns, "p", "a", 180.0)
    return pod


async def replay(url: str, requests: list[tuple[float, str]], out: Outcome) -> None:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.monotonic()

        async def one(at: float, model: str) -> None:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            try:
                out.ttft.append(await bench_swap.first_byte(
                    session, url + "/chat/completions", model))
            except Exception as e:  # counted, and the run goes on
                print(f"  {out.pool}: {model}: {e}", file=sys.stderr)
                out.errors += 1

        await asyncio.gather(*(one(at, model) for at, model in requests))


def count(kubectl: Kubectl, ns: str, router: harness.Pod, out: Outcome) -> None:
    reconciler = harness.reconciler_pod(kubectl, harness.Installation(harness.RECONCILER, None))
    families = harness.scrape(harness.metrics_url(reconciler))
    out.loads = harness.sample_sum(families, "modelpool_swaps_total", namespace=ns)
    if out.pool == "budgeted":
        out.unloads = harness.sample_sum(families, "modelpool_evictions_total", namespace=ns)
    else:  # a swap from a resident unloads it; a load into a Cold pool unloads nothing
        out.unloads = out.loads - harness.sample_sum(families, "modelpool_swaps_total",
                                                     namespace=ns, **{"from": ""})
    routed = harness.scrape(harness.metrics_url(router))
    out.held = harness.sample_sum(routed, "modelpool_hold_duration_seconds_count")


def row(out: Outcome) -> str:
    p50 = statistics.median(out.ttft) if out.ttft else float("nan")
    p95 = percentile(out.ttft, 0.95) if out.ttft else float("nan")
    return (f"| {out.pool} | {len(out.ttft)} | {out.errors} | {out.loads:.0f} | "
            f"{out.unloads:.0f} | {p50:.3f} | {p95:.3f} | {out.held:.0f} |")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rate", type=float, default=0.5, help="requests per second")
    parser.add_argument("--load", type=float, default=3.0, help="each member's load, seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    kubectl = Kubectl(kubeconfig(), "kubectl")
    requests = trace(args.requests, args.rate, args.seed)
    spread = {m: sum(1 for _, x in requests if x == m) for m in FOOTPRINTS}
    print(f"trace: {len(requests)} requests over {requests[-1][0]:.0f} s, {spread}, "
          f"load {args.load:g} s, seed {args.seed}")
    outcomes = []
    for pool in ("exclusive", "budgeted"):
        ns = f"bench-budget-{pool}"
        namespace(kubectl, ns)
        try:
            router = set_up(kubectl, ns, pool == "budgeted", args.load)
            out = Outcome(pool)
            await replay(harness.base_url(router), requests, out)
            count(kubectl, ns, router, out)
            outcomes.append(out)
            print(row(out), flush=True)
        finally:
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
    print()
    print("| pool | answered | errors | loads | unloads forced | TTFT p50 s | TTFT p95 s "
          "| held |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for out in outcomes:
        print(row(out))
    exclusive, budgeted = outcomes
    if exclusive.ttft and budgeted.ttft:
        ratio_swaps = exclusive.unloads / max(budgeted.unloads, 1.0)
        ratio_p95 = percentile(exclusive.ttft, 0.95) / percentile(budgeted.ttft, 0.95)
        print(f"\nexclusive/budgeted: unloads {ratio_swaps:.1f}x (goal >= 3), "
              f"TTFT p95 {ratio_p95:.1f}x (goal >= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
