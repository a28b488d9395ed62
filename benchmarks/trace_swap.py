"""Where a warm swap's time goes, hop by hop, on the local testbed.

`bench_swap.py` says how long a swap takes beyond the model server's own unload and load;
this script says why. It installs the same warm pool as the benchmark (two fake members,
one resident, a router in front), then for each swap watches pods, ReplicaSets,
Deployments, the ModelPool and EndpointSlices of the namespace (`kubectl get --watch`,
each event stamped with `time.monotonic()` on arrival) while one streamed request asks
for the other member, and afterwards reads the node agent's and the reconciler's JSON
logs. Every hop of the chain is printed relative to the request's send time:

    request sent -> router's CAS of status.request -> pool Draining -> idle probe ->
    pool Unloading -> Deployment 0 -> ReplicaSet 0 -> pod deletionTimestamp -> SIGTERM ->
    process exit -> pod deleted -> pool Loading -> Deployment 1 -> ReplicaSet 1 -> pod
    created -> bound -> process started -> pod Ready -> EndpointSlice ready -> first byte

and the mean of each hop over all swaps closes the report.

    .venv/bin/python benchmarks/trace_swap.py --swaps 6
    .venv/bin/python benchmarks/trace_swap.py --swaps 6 --state-dir /tmp/mine --keep

It runs its own cluster in its own state directory (taken down unless `--keep`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
for entry in (REPO, REPO / "benchmarks"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import bench_swap  # noqa: E402

from e2e import harness  # noqa: E402
from e2e.local import controlplane  # noqa: E402
from e2e.local.demo import Kubectl  # noqa: E402
from e2e.local.paths import StateLayout  # noqa: E402

Json = dict[str, Any]
WATCHED = ("pods", "replicasets.apps", "deployments.apps",
           f"modelpools.{harness.GROUP}", "endpointslices.discovery.k8s.io")


@dataclass(frozen=True)
class Stamp:
    at: float  # time.monotonic()
    what: str


@dataclass
class Recorder:
    """Watch events as they arrive: the raw stream, the hops derived from it."""

    stamps: list[Stamp] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def mark(self, what: str, at: float, once: bool = True) -> None:
        if once and what in self.seen:
            return
        self.seen.add(what)
        self.stamps.append(Stamp(at, what))

    def reset(self) -> None:
        self.stamps.clear()
        self.seen.clear()


def member_of(obj: Json) -> str:
    """The member an object belongs to (its server label, or its Service's), else '?'."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get(harness.LABEL_SERVER) or
               labels.get("kubernetes.io/service-name") or "?")


def describe(kind: str, type_: str, obj: Json) -> list[str]:
    """What one watch event tells about the swap, as hop names."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get(
        "status") or {}
    name = meta.get("name", "?")
    if kind == "pods":
        member = member_of(obj)
        if member == "?":
            return []
        hops = []
        if type_ == "ADDED":
            hops.append(f"pod {member} created")
        if type_ == "DELETED":
            return [f"pod {member} deleted"]
        if meta.get("deletionTimestamp"):
            hops.append(f"pod {member} deletionTimestamp")
        if spec.get("nodeName"):
            hops.append(f"pod {member} bound")
        if status.get("phase") == "Running":
            hops.append(f"pod {member} Running")
        phase = status.get("phase")
        if phase in ("Succeeded", "Failed"):
            hops.append(f"pod {member} {phase}")
        for c in status.get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                hops.append(f"pod {member} Ready")
        for c in status.get("containerStatuses") or []:
            if "terminated" in (c.get("state") or {}):
                hops.append(f"pod {member} container terminated")
        return hops
    if kind in ("replicasets.apps", "deployments.apps"):
        short = "rs" if kind.startswith("replicasets") else "deploy"
        member = member_of(obj)
        if member == "?":
            return []
        hops = [f"{short} {member} spec.replicas={spec.get('replicas')}"]
        hops.append(f"{short} {member} status.replicas={status.get('replicas') or 0}")
        return hops
    if kind.startswith("modelpools"):
        if name != bench_swap.WARM_POOL:
            return []
        hops = []
        request = status.get("request") or {}
        if request.get("generation") is not None:
            hops.append(f"pool request gen {request.get('generation')} -> "
                        f"{request.get('member')}")
        swap = status.get("swap") or {}
        if swap:
            hops.append(f"pool swap {swap.get('phase')}")
        hops.append(f"pool phase {status.get('phase')}")
        return hops
    if kind.startswith("endpointslices"):
        member = member_of(obj)
        ready = [e for e in obj.get("endpoints") or []
                 if (e.get("conditions") or {}).get("ready")]
        return [f"slice {member} ready={len(ready)}"]
    return []


async def watch(kubectl: Kubectl, namespace: str, kind: str, recorder: Recorder,
                started: asyncio.Event) -> None:
    argv = kubectl.argv("get", kind, "-n", namespace, "--watch", "--output-watch-events",
                        "-o", "json")
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert process.stdout is not None
    buffer = ""
    try:
        while True:
            line = await process.stdout.readline()
            if not line:
                return
            at = time.monotonic()
            started.set()
            events, buffer = harness.split_json_stream(buffer + line.decode())
            for event in events:
                for hop in describe(kind, str(event.get("type")), event.get("object") or {}):
                    recorder.mark(hop, at)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


def log_stamps(path: Path, since_wall: float, offset: float,
               pick: Callable[[Json], str | None]) -> list[Stamp]:
    """Lines of a JSON-lines log written after `since_wall`, as stamps on the monotonic
    clock (`offset` = wall - monotonic); `pick` names a line's hop or skips it."""
    stamps: list[Stamp] = []
    if not path.exists():
        return stamps
    for raw in path.read_text(errors="replace").splitlines():
        try:
            line = json.loads(raw)
            wall = datetime.fromisoformat(line["time"]).timestamp()
        except (ValueError, KeyError, TypeError):
            # The fake model server logs plain text: "2026-11-30 12:00:00,123 INFO name: m"
            try:
                date, clock, _level, rest = raw.split(" ", 3)
                wall = datetime.strptime(f"{date} {clock}", "%Y-%m-%d %H:%M:%S,%f").replace(
                    tzinfo=UTC).timestamp()
                line = {"message": rest.split(": ", 1)[-1]}
            except ValueError:
                continue
        if wall < since_wall:
            continue
        what = pick(line)
        if what:
            stamps.append(Stamp(wall - offset, what))
    return stamps


def node_agent_hop(line: Json) -> str | None:
    message, pod = str(line.get("message", "")), str(line.get("pod", ""))
    member = pod.rsplit("/", 1)[-1].split("-", 1)[0] if pod else ""
    if member not in ("w0", "w1"):
        return None
    for needle, hop in (("pod terminating; stopping it", "SIGTERM sent"),
                        ("exited with", "process exited"),
                        ("deleting the pod object", "pod delete sent"),
                        ("started (pid", "process started")):
        if needle in message:
            return f"agent {member} {hop}"
    return None


def reconciler_hop(line: Json) -> str | None:
    message = str(line.get("message", ""))
    if message.startswith("scaling "):
        return f"reconciler {message}"
    return None


def fake_model_hop(member: str) -> Callable[[Json], str | None]:
    def pick(line: Json) -> str | None:
        message = str(line.get("message", ""))
        if "aiohttp" in message or "HTTP/1.1" in message:
            return None
        return f"server {member}: {message[:60]}" if message else None
    return pick


@dataclass(frozen=True)
class Timed:
    """One swap's request: when it was sent (monotonic and wall clock), the offset from
    one clock to the other, and the seconds to its first byte."""

    t0: float
    wall0: float
    offset: float  # wall - monotonic
    first: float


async def time_swap(session: aiohttp.ClientSession, url: str, target: str,
                    recorder: Recorder, kubectl: Any, namespace: str) -> Timed:
    """Ask the router at `url` for `target`, stamp the first byte, and wait until the pool
    is Ready with it and the swap's late watch events (slices, statuses) have arrived."""
    recorder.reset()
    offset = time.time() - time.monotonic()
    wall0 = time.time()
    t0 = time.monotonic()
    first = await bench_swap.first_byte(session, url, target)
    recorder.mark("first byte", t0 + first)
    await asyncio.to_thread(harness.wait_pool_ready, kubectl, namespace, bench_swap.WARM_POOL,
                            target, 60.0)
    await asyncio.sleep(0.5)
    return Timed(t0, wall0, offset, first)


async def one_swap(
    kubectl: Kubectl, namespace: str, url: str, target: str, layout: StateLayout,
    reconciler: harness.Pod, recorder: Recorder, session: aiohttp.ClientSession,
) -> list[Stamp]:
    timed = await time_swap(session, url, target, recorder, kubectl, namespace)
    t0, wall0, offset = timed.t0, timed.wall0, timed.offset
    stamps = [Stamp(t0, "request sent"), *recorder.stamps]
    stamps += log_stamps(layout.log("node-agent"), wall0, offset, node_agent_hop)
    recon_dir = harness.pod_directory(layout.node_state, reconciler)
    for log_file in recon_dir.glob("*.log"):
        stamps += log_stamps(log_file, wall0, offset, reconciler_hop)
    for member in ("w0", "w1"):  # the incumbent's pod is gone; its directory stays
        for log_file in (layout.node_state / "pods").glob(f"{namespace}_{member}-*/*.log"):
            stamps += log_stamps(log_file, wall0, offset, fake_model_hop(member))
    return sorted((Stamp(s.at - t0, s.what) for s in stamps), key=lambda s: s.at)


def generic(what: str, incumbent: str, target: str) -> str:
    """A hop's name with the members as roles, so swaps in both directions average."""
    return what.replace(f" {incumbent} ", " INCUMBENT ").replace(
        f" {target} ", " TARGET ").replace(f" {incumbent}:", " INCUMBENT:").replace(
        f" {target}:", " TARGET:").replace(f"-> {target}", "-> TARGET").replace(
        f"scaling {incumbent} ", "scaling INCUMBENT ").replace(
        f"scaling {target} ", "scaling TARGET ")


async def run(options: argparse.Namespace) -> None:
    layout = StateLayout(options.state_dir.resolve())
    cluster = controlplane.up(controlplane.UpOptions(
        state_dir=options.state_dir, python=sys.executable, gpus=options.gpus))
    kubectl = Kubectl(cluster.kubeconfig,
                      shutil.which("kubectl") or str(cluster.bin_dir / "kubectl"))
    namespace = f"trace-swap-{secrets.token_hex(3)}"
    bench_options = bench_swap.Options(options.state_dir, options.swaps, 0, options.load_time,
                                       options.unload_time, True, False)
    recorder = Recorder()
    tasks: list[asyncio.Task[None]] = []
    try:
        router, reconciler = await asyncio.to_thread(
            bench_swap.setup, kubectl, namespace, bench_options)
        for kind in WATCHED:
            started = asyncio.Event()
            tasks.append(asyncio.create_task(watch(kubectl, namespace, kind, recorder,
                                                   started)))
            await asyncio.wait_for(started.wait(), 30.0)
        url = f"{harness.base_url(router)}/chat/completions"
        totals: dict[str, list[float]] = {}
        async with aiohttp.ClientSession(trust_env=False) as session:
            await bench_swap.first_byte(session, url, "w0")
            for i in range(options.swaps):
                target, incumbent = ("w1", "w0") if i % 2 == 0 else ("w0", "w1")
                stamps = await one_swap(kubectl, namespace, url, target, layout, reconciler,
                                        recorder, session)
                print(f"\nswap {i + 1}: {incumbent} -> {target}")
                previous = 0.0
                for stamp in stamps:
                    print(f"  {stamp.at:7.3f}s  (+{stamp.at - previous:6.3f})  {stamp.what}")
                    previous = stamp.at
                    totals.setdefault(generic(stamp.what, incumbent, target), []).append(
                        stamp.at)
        print("\nmean time from the request's send, over every swap that showed the hop:")
        for what, ats in sorted(totals.items(), key=lambda kv: statistics.fmean(kv[1])):
            print(f"  {statistics.fmean(ats):7.3f}s  n={len(ats):<3} {what}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        harness.uninstall_scope(kubectl, namespace)
        if not options.keep:
            controlplane.down(cluster.state_dir)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trace_swap.py", description=__doc__.split("\n")[0])
    p.add_argument("--state-dir", type=Path, default=Path("/tmp/modelpool-trace-swap"))
    p.add_argument("--swaps", type=int, default=6)
    p.add_argument("--load-time", type=float, default=2.0)
    p.add_argument("--unload-time", type=float, default=0.5)
    p.add_argument("--gpus", type=int, default=1,
                   help="the node's GPUs (1: the target can only be bound once the "
                        "incumbent's pod is gone, as on a one-GPU node)")
    p.add_argument("--keep", action="store_true", help="leave the cluster running")
    options = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    asyncio.run(run(options))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
