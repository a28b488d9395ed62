"""System benchmark on kind: what a swap costs beyond the model server's own unload and
load, with a real kubelet and container start in the path.

The kind cluster of e2e/kind/up.sh (MODELPOOL_KIND_KUBECONFIG, else up.sh is run): a pool
of two fake members pinned to the node with two GPUs (each asks for one), the router on
the control-plane node, requests sent from this machine to the router pod's address.
Each sample asks for the member that is not resident and measures arrival to first byte:

    overhead = time to first byte - (unload time + load time)

The fake server's load time counts from its process's exec, so Python's start-up is inside
it; container creation, sandbox and network set-up, scheduling and the reconciler's work are
the overhead. Same definition as benchmarks/bench_swap.py on the local testbed.

With `--real`, the members are real llama-servers (modelpool/llama-server) serving the
tiny generated models: their own load (0.02 s warm, benchmarks/bench_llama_load.py) and
unload (exit within 0.01 s of SIGTERM when idle) are given as `--load 0.02 --unload 0.01`,
so the overhead is nearly the whole time to first byte.

    .venv/bin/python benchmarks/bench_swap_kind.py --swaps 20
    .venv/bin/python benchmarks/bench_swap_kind.py --swaps 20 --real --load 0.02 --unload 0.01
    .venv/bin/python benchmarks/bench_swap_kind.py --swaps 20 --cold 10
    .venv/bin/python benchmarks/bench_swap_kind.py --swaps 20 --scratch both --pause 2

`--scratch both` runs two pools side by side on that node (it has a GPU for each
resident): `swap`, whose members have their writable /tmp and home (the default), and
`bare`, whose members have `scratch: false` and so no volume at all. Swaps alternate
between the pools, so a drift of the host's load reaches both alike, and each pool rests
while the other swaps. `--scratch false` runs the bare pool alone.

A cold sample (`--cold`) asks a pool with nothing resident for its one member, on the same
node: overhead = time to first byte - load time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import bench_swap  # noqa: E402
from e2e import harness  # noqa: E402
from e2e.local.fixtures import Kubectl  # noqa: E402

NODE = "modelpool-worker2"
CONTROL_PLANE = "modelpool-control-plane"


def kubeconfig() -> Path:
    configured = os.environ.get("MODELPOOL_KIND_KUBECONFIG")
    if configured:
        return Path(configured)
    out = subprocess.run(["bash", str(REPO / "e2e" / "kind" / "up.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def member(name: str, load: float, unload: float, real: bool = False,
           scratch: bool = True) -> harness.Json:
    if real:
        # the image holds beta.gguf and gemma.gguf: a bare pool's "beta-bare" serves beta's
        model = name.removesuffix("-bare")
        server = harness.fake_member(name, scratch=scratch)
        server["spec"].update(image="modelpool/llama-server:e2e", model=f"/models/{model}.gguf",
                              args=["--alias", name, "-c", "2048"], env=[])
        return harness.on_node(server, NODE)
    return harness.on_node(harness.fake_member(
        name, load_time=load, env={"FAKE_MODEL_UNLOAD_TIME": str(unload)}, scratch=scratch),
        NODE)


@dataclass
class Pool:
    """One pool of two members under test, and what its swaps measured."""

    name: str
    members: tuple[str, str]
    scratch: bool
    resident: str = ""
    overheads: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return "with /tmp and home (scratch)" if self.scratch else "no volume (scratch: false)"


def pools_under_test(choice: str, real: bool) -> list[Pool]:
    a, b = ("beta", "gemma") if real else ("a", "b")
    pools = []
    if choice in ("true", "both"):
        pools.append(Pool("swap", (a, b), scratch=True))
    if choice in ("false", "both"):
        pools.append(Pool("bare", (f"{a}-bare", f"{b}-bare"), scratch=False))
    return pools


async def first_byte(session: aiohttp.ClientSession, url: str, model: str) -> float:
    """Seconds from sending a streamed chat request to the router at `url` (its /v1) to the
    first event of the model's answer."""
    return await bench_swap.first_byte(session, url + "/chat/completions", model)


def wait_cold(kubectl: Kubectl, namespace: str, member_name: str) -> None:
    """Until the cold pool has nothing resident and its member's pods are gone: the next
    request loads from zero."""
    def check() -> bool | None:
        body = kubectl.json("get", f"modelpools.{harness.GROUP}", "cold", "-n", namespace)
        if (body.get("status") or {}).get("phase") != "Cold":
            return None
        pods = kubectl.json("get", "pods", "-n", namespace, "-l",
                            f"{harness.LABEL_SERVER}={member_name}")["items"]
        return True if not pods else None
    harness.eventually(check, f"pool cold empty, {member_name}'s pod gone", 60.0)


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat's first line, in clock ticks)."""
    with open("/proc/stat") as stat:
        return [int(v) for v in stat.readline().split()[1:]]


def steal_percent(before: list[int], after: list[int]) -> float:
    """The share of CPU time the hypervisor gave to other guests between two readings
    (`steal`, the 8th counter): on a shared host, the cores this run did not have."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return 100.0 * delta[7] / max(1, sum(delta))


def phase_means(family: Any, namespace: str, pool: str) -> dict[str, float]:
    """The mean of each swap phase of one pool, from the reconciler's histogram."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for sample in family.samples if family is not None else ():
        if sample.labels.get("namespace") != namespace or sample.labels.get("pool") != pool:
            continue
        phase = sample.labels.get("phase", "?")
        if sample.name.endswith("_sum"):
            sums[phase] = sample.value
        elif sample.name.endswith("_count"):
            counts[phase] = sample.value
    return {ph: sums[ph] / counts[ph] for ph in sums if counts.get(ph)}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--load", type=float, default=2.0, help="fake load time, seconds")
    parser.add_argument("--unload", type=float, default=0.5, help="fake unload time, seconds")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds between the pool reading Ready and the next swap")
    parser.add_argument("--cold", type=int, default=0,
                        help="cold loads to measure as well: a pool with nothing resident "
                             "(idleUnloadAfter 3s empties it between samples)")
    parser.add_argument("--real", action="store_true",
                        help="real llama-servers (tiny models beta and gemma) as the members")
    parser.add_argument("--scratch", choices=("true", "false", "both"), default="true",
                        help="members with their writable /tmp and home (true, the default), "
                             "with no volume (false), or a pool of each, swapped in turn")
    args = parser.parse_args()
    pools = pools_under_test(args.scratch, args.real)
    if args.cold and len(pools) > 1:
        parser.error("--cold needs the node's second GPU: not with --scratch both")
    kubectl = Kubectl(kubeconfig(), shutil.which("kubectl") or "kubectl")
    ns = f"bench-swap-{secrets.token_hex(3)}"
    kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    try:
        for _ in range(150):
            if kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0:
                break
            await asyncio.sleep(0.2)
        # the cold member: a pool of its own on the same node, using its other GPU
        c = "c"
        cold = [member(c, args.load, args.unload),
                harness.pool("cold", [c], swap_budget="120s", idleUnloadAfter="3s")]
        backends = [m for p in pools for m in p.members] + ([c] if args.cold else [])
        router = harness.router_on_node(harness.router("bench", backends), CONTROL_PLANE)
        objects = []
        for p in pools:
            objects += [member(m, args.load, args.unload, args.real, p.scratch)
                        for m in p.members]
            objects.append(harness.pool(p.name, list(p.members), default=p.members[0],
                                        swap_budget="120s"))
        harness.apply(kubectl, ns, *objects, *(cold if args.cold else []), router)
        (pod,) = harness.wait_router_ready(kubectl, ns, "bench", None, 180.0)
        for p in pools:
            harness.wait_pool_ready(kubectl, ns, p.name, p.members[0], 180.0)
        url = harness.base_url(pod)
        counters = cpu_times()
        cold_overheads: list[float] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
            for p in pools:
                await first_byte(s, url, p.members[0])
                p.resident = p.members[0]
            for _ in range(args.swaps):
                for p in pools:
                    target = p.members[1] if p.resident == p.members[0] else p.members[0]
                    ttfb = await first_byte(s, url, target)
                    p.overheads.append(ttfb - args.load - args.unload)
                    p.resident = target
                    # the next swap starts from a settled pool, as a user's would
                    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, p.name,
                                            p.resident, 60.0)
                    # (a user's next request for the other model, some time later)
                    await asyncio.sleep(args.pause)
            for _ in range(args.cold):
                await asyncio.to_thread(wait_cold, kubectl, ns, c)
                ttfb = await first_byte(s, url, c)
                cold_overheads.append(ttfb - args.load)
        reconciler = kubectl.json("get", "pods", "-n", "modelpool-system", "-l",
                                  "app.kubernetes.io/name=modelpool-reconciler")["items"]
        ip = next(p["status"]["podIP"] for p in reconciler if p["status"].get("podIP"))
        family = harness.scrape(f"http://{ip}:9090/metrics").get(
            "modelpool_swap_phase_duration_seconds")
        load = os.getloadavg()[0]
        steal = steal_percent(counters, cpu_times())
        kind = "real llama-server members" if args.real else "fake members"
        print(f"kind swap overhead, {kind}, {args.pause:g}s after Ready, {args.swaps} warm "
              f"swaps a pool (load {args.load:g}s, "
              f"unload {args.unload:g}s, load average {load:.1f}, CPU steal {steal:.0f}%):")
        baseline = pct(pools[0].overheads, 50)
        for p in pools:
            o = p.overheads
            ratio = "" if p is pools[0] else (
                f"  p50 vs {pools[0].name}: {pct(o, 50) / baseline:.2f}")
            print(f"  pool {p.name}, {p.label}:")
            print(f"    p50 {pct(o, 50):.2f}s  p95 {pct(o, 95):.2f}s  "
                  f"mean {statistics.mean(o):.2f}s  max {max(o):.2f}s{ratio}")
            print("    each: " + " ".join(f"{v:.2f}" for v in o))
            means = phase_means(family, ns, p.name)
            print("    mean per phase (reconciler): " + ", ".join(
                f"{ph} {means[ph]:.2f}s" for ph in ("drain", "unload", "schedule", "load")
                if ph in means))
        if cold_overheads:
            print(f"  cold (load from zero, {len(cold_overheads)} samples): "
                  f"p50 {pct(cold_overheads, 50):.2f}s  p95 {pct(cold_overheads, 95):.2f}s  "
                  f"mean {statistics.mean(cold_overheads):.2f}s  "
                  f"max {max(cold_overheads):.2f}s")
            print("  each: " + " ".join(f"{o:.2f}" for o in cold_overheads))
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
