"""Where a warm swap's time goes on kind, hop by hop, the kubelet and containerd included.

`bench_swap_kind.py` says how long a swap takes beyond the model server's own unload and
load on a real kubelet; this script says why. It installs the benchmark's pool (two fake
members on the node with two GPUs, the router on the control-plane node), then for each
swap watches the namespace's pods, ReplicaSets, Deployments, ModelPool and EndpointSlices
(`kubectl get --watch`, each event stamped on arrival), while one streamed request asks
for the other member. Afterwards it reads, from the GPU node's journal, what the kubelet
and containerd logged about the two members' pods, and the reconciler's log. Every hop is
printed relative to the request's send time, and the mean of each hop over all swaps
closes the report:

    MODELPOOL_KIND_KUBECONFIG=... .venv/bin/python benchmarks/trace_swap_kind.py --swaps 6
    ... --pause 2    # a pause between the pool reading Ready and the next request
    ... --raw        # every journal line that names a member's pod, for reading

The kind nodes are containers on this machine, so the journal's clock is this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
for entry in (REPO, REPO / "benchmarks"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import bench_swap  # noqa: E402
import bench_swap_kind  # noqa: E402
import trace_swap  # noqa: E402

from e2e import harness  # noqa: E402
from e2e.local.demo import Kubectl  # noqa: E402

POOL = bench_swap.WARM_POOL  # the name trace_swap.describe follows
# What the kubelet (klog) and containerd log about a pod, as hop names; the first that
# matches a line names it.
JOURNAL_HOPS = (
    ("SyncLoop ADD", "kubelet: pod added"),
    ("SyncLoop DELETE", "kubelet: pod deletion seen"),
    ("SyncLoop REMOVE", "kubelet: pod object removed"),
    ("Killing container with a grace period", "kubelet: killing container"),
    ("ContainerDied", "kubelet PLEG: container died"),
    ("ContainerStarted", "kubelet PLEG: container or sandbox started"),
    ("RunPodSandbox for", "containerd: RunPodSandbox"),
    ("CreateContainer within sandbox", "containerd: CreateContainer"),
    ("StartContainer for", "containerd: StartContainer"),
    ("returns successfully", "containerd: call done"),
    ("StopContainer for", "containerd: StopContainer"),
    ("StopPodSandbox for", "containerd: StopPodSandbox"),
    ("TearDown network", "containerd: network torn down"),
    ("Pod status updated", "kubelet: status written"),
    ("Status for pod updated successfully", "kubelet: status written"),
)
_CONTAINERD_ID = re.compile(r'"?([0-9a-f]{64})"?')


def journal(node: str, since_wall: float) -> list[tuple[float, str, str]]:
    """(wall time, unit, message) of the kubelet's and containerd's lines since then."""
    out = subprocess.run(
        ["docker", "exec", node, "journalctl", "-u", "kubelet", "-u", "containerd",
         "--since", f"@{since_wall:.3f}", "-o", "json", "--no-pager"],
        check=True, capture_output=True, text=True).stdout
    lines = []
    for raw in out.splitlines():
        try:
            entry = json.loads(raw)
            wall = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
            message = entry.get("MESSAGE")
        except (ValueError, KeyError):
            continue
        if isinstance(message, str):
            lines.append((wall, str(entry.get("_SYSTEMD_UNIT", "?")), message))
    return lines


def journal_stamps(lines: list[tuple[float, str, str]], pods: dict[str, str], offset: float,
                   raw: bool) -> list[trace_swap.Stamp]:
    """Stamps for the lines that name one of `pods` (pod name -> member), or a sandbox or
    container id that an earlier such line introduced (containerd names them by id)."""
    ids: dict[str, str] = {}
    stamps: list[trace_swap.Stamp] = []
    for wall, unit, message in lines:
        member = next((m for name, m in pods.items() if name in message), None)
        if member is None:
            member = next((m for cid, m in ids.items() if cid in message), None)
        if member is None:
            continue
        for found in _CONTAINERD_ID.findall(message):  # a sandbox's line names its container
            ids.setdefault(found, member)
        short = unit.removesuffix(".service")
        if raw:
            text = _CONTAINERD_ID.sub(lambda m: m.group(1)[:8], message)
            stamps.append(trace_swap.Stamp(wall - offset, f"{short} {member}: {text[:160]}"))
            continue
        for needle, hop in JOURNAL_HOPS:
            if needle in message:
                stamps.append(trace_swap.Stamp(wall - offset, f"{hop} ({member})"))
                break
    return stamps


def reconciler_stamps(kubectl: Kubectl, since_wall: float, offset: float,
                      namespace: str) -> list[trace_swap.Stamp]:
    """The reconciler's scale decisions for this namespace, from its JSON log."""
    out = kubectl("logs", "-n", "modelpool-system", "deploy/modelpool-reconciler",
                  "--since=120s", check=False).stdout
    stamps = []
    for raw in out.splitlines():
        try:
            line = json.loads(raw)
            wall = datetime.fromisoformat(line["time"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if wall < since_wall or namespace not in raw:
            continue
        message = str(line.get("message", ""))
        hop = trace_swap.reconciler_hop(line) or (
            f"reconciler {message.split(' to the scheduler')[0]}"
            if message.startswith("released ") else None)
        if hop:
            stamps.append(trace_swap.Stamp(wall - offset, hop))
    return stamps


async def run(options: argparse.Namespace) -> None:
    config = bench_swap_kind.kubeconfig()
    kubectl = Kubectl(config, shutil.which("kubectl") or "kubectl")
    namespace = f"trace-swap-{secrets.token_hex(3)}"
    kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    recorder = trace_swap.Recorder()
    tasks: list[asyncio.Task[None]] = []
    try:
        harness.eventually(
            lambda: kubectl("get", "sa", "default", "-n", namespace,
                            check=False).returncode == 0 or None,
            "the namespace's default ServiceAccount", 30)
        router = harness.router_on_node(harness.router("bench", ["a", "b"]),
                                        bench_swap_kind.CONTROL_PLANE)
        harness.apply(kubectl, namespace,
                      bench_swap_kind.member("a", options.load, options.unload,
                                             scratch=options.scratch),
                      bench_swap_kind.member("b", options.load, options.unload,
                                             scratch=options.scratch),
                      harness.pool(POOL, ["a", "b"], default="a", swap_budget="120s"),
                      router)
        (pod,) = harness.wait_router_ready(kubectl, namespace, "bench", None, 180.0)
        harness.wait_pool_ready(kubectl, namespace, POOL, "a", 180.0)
        for kind in trace_swap.WATCHED:
            started = asyncio.Event()
            tasks.append(asyncio.create_task(
                trace_swap.watch(kubectl, namespace, kind, recorder, started)))
            await asyncio.wait_for(started.wait(), 30.0)
        url = f"{harness.base_url(pod)}/chat/completions"
        totals: dict[str, list[float]] = {}
        overheads: list[float] = []
        async with aiohttp.ClientSession(trust_env=False) as session:
            await bench_swap.first_byte(session, url, "a")
            for i in range(options.swaps):
                target, incumbent = ("b", "a") if i % 2 == 0 else ("a", "b")
                pods = {p["metadata"]["name"]: trace_swap.member_of(p) for p in kubectl.json(
                    "get", "pods", "-n", namespace, "-l", harness.LABEL_SERVER)["items"]}
                timed = await trace_swap.time_swap(session, url, target, recorder, kubectl,
                                                   namespace)
                t0, wall0, offset, first = timed.t0, timed.wall0, timed.offset, timed.first
                pods.update({p["metadata"]["name"]: trace_swap.member_of(p) for p in kubectl.json(
                    "get", "pods", "-n", namespace, "-l", harness.LABEL_SERVER)["items"]})
                stamps = [trace_swap.Stamp(t0, "request sent"), *recorder.stamps]
                stamps += journal_stamps(journal(bench_swap_kind.NODE, wall0 - 0.5),
                                         pods, offset, options.raw)
                stamps += reconciler_stamps(kubectl, wall0, offset, namespace)
                stamps = sorted((trace_swap.Stamp(s.at - t0, s.what) for s in stamps
                                 if s.at >= t0 - 0.5), key=lambda s: s.at)
                overhead = first - options.load - options.unload
                overheads.append(overhead)
                print(f"\nswap {i + 1}: {incumbent} -> {target}, first byte {first:.3f}s, "
                      f"overhead {overhead:.3f}s")
                previous = 0.0
                seen: set[str] = set()
                for stamp in stamps:
                    print(f"  {stamp.at:7.3f}s  (+{stamp.at - previous:6.3f})  {stamp.what}")
                    previous = stamp.at
                    name = trace_swap.generic(stamp.what, incumbent, target).replace(
                        f"({incumbent})", "(INCUMBENT)").replace(f"({target})", "(TARGET)")
                    if name not in seen:  # a hop's first time in this swap
                        seen.add(name)
                        totals.setdefault(name, []).append(stamp.at)
                await asyncio.sleep(options.pause)
        if not options.raw:
            print(f"\nmean time from the request's send over {options.swaps} swaps "
                  "(each hop's first occurrence; n = swaps that showed it):")
            for what, ats in sorted(totals.items(), key=lambda kv: statistics.fmean(kv[1])):
                print(f"  {statistics.fmean(ats):7.3f}s  n={len(ats):<3} {what}")
        print(f"\noverhead p50 {statistics.median(overheads):.3f}s, mean "
              f"{statistics.fmean(overheads):.3f}s over {len(overheads)} swaps")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)



def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trace_swap_kind.py", description=__doc__.split("\n")[0])
    p.add_argument("--swaps", type=int, default=6)
    p.add_argument("--load", type=float, default=2.0, help="fake load time, seconds")
    p.add_argument("--unload", type=float, default=0.5, help="fake unload time, seconds")
    p.add_argument("--pause", type=float, default=0.0,
                   help="seconds between the pool reading Ready and the next request")
    p.add_argument("--no-scratch", dest="scratch", action="store_false",
                   help="members with `scratch: false`: no volume, so no kubelet volume wait")
    p.add_argument("--raw", action="store_true",
                   help="every journal line naming a member's pod instead of named hops")
    options = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    counters = bench_swap_kind.cpu_times()
    asyncio.run(run(options))
    print(f"load average at end: {os.getloadavg()[0]:.2f}, CPU steal over the run "
          f"{bench_swap_kind.steal_percent(counters, bench_swap_kind.cpu_times()):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
