"""System benchmark on kind: a swap's time to first byte with and without `spec.prewarm`,
from a cold page cache, with real llama-servers loading about 1 GB of weights each.

The kind cluster of e2e/kind/up.sh (MODELPOOL_KIND_KUBECONFIG, else up.sh is run). Two
generated models (e2e/llama/models.py `xlarge`) are copied into the GPU node's filesystem
and served to two real llama-server members through a PersistentVolume on that node (a
restricted namespace admits a PVC, never a hostPath). Each round, for prewarm on and off in
alternating order: the pool's spec.prewarm is set, the page cache is dropped (`echo 3 >
/proc/sys/vm/drop_caches`: kind's nodes share this machine's kernel, so as root this drops
theirs), and a request for the member that is not resident is timed from its sending to its
first event. With prewarm, a pod on the incumbent's node reads the target's file while the
incumbent drains and unloads, so llama-server's load reads memory. With `--drain-tokens N`
a streamed generation of N tokens is in flight on the incumbent when the swap is asked for,
so the swap drains it first (the case prewarm is for: a drain to read during).

    .venv/bin/python benchmarks/bench_prewarm.py --rounds 5 [--drain-tokens 64]
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
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_swap_kind import (  # noqa: E402
    CONTROL_PLANE,
    NODE,
    first_byte,
    kubeconfig,
    pct,
)
from e2e import harness  # noqa: E402
from e2e.llama import models  # noqa: E402
from e2e.local.fixtures import Kubectl  # noqa: E402

NODE_DIR = "/var/lib/modelpool-bench"
MEMBERS = ("alpha", "omega")


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def place_models(size: str) -> int:
    """Generate the members' models and copy them into the GPU node; their total bytes."""
    total = 0
    subprocess.run(["docker", "exec", NODE, "mkdir", "-p", NODE_DIR], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in MEMBERS:
            path = models.write_model(Path(tmp), name, size)
            total += path.stat().st_size
            os.chmod(path, 0o644)
            subprocess.run(["docker", "cp", str(path), f"{NODE}:{NODE_DIR}/{name}.gguf"],
                           check=True)
    return total


async def in_flight(session: aiohttp.ClientSession, url: str, model: str, tokens: int,
                    started: asyncio.Event) -> float:
    """A streamed generation of `tokens` on `model`; `started` is set at its first event.
    When it ended (time.monotonic)."""
    body = {"model": model, "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": tokens, "stream": True}
    first = None
    async with session.post(url + "/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if first is None and line.startswith(b"data:"):
                first = time.monotonic()
                started.set()
    assert first is not None, "the generation in flight sent no event"
    return time.monotonic()


def member(name: str) -> harness.Json:
    server = harness.fake_member(name)
    server["spec"].update(image="modelpool/llama-server:e2e", model=f"/weights/{name}.gguf",
                          args=["--alias", name, "-c", "2048"], env=[],
                          storage={"pvc": "weights", "mountPath": "/weights"},
                          # as a model server asks for CPU (the prewarm pod asks for none)
                          resources={"gpu": 1, "cpu": "500m"})
    return harness.on_node(server, NODE)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", default="xlarge", choices=sorted(models.SIZES))
    parser.add_argument("--drain-tokens", type=int, default=0,
                        help="a generation of this many tokens in flight on the incumbent "
                             "when the swap is asked for (0: none)")
    args = parser.parse_args()
    kubectl = Kubectl(kubeconfig(), shutil.which("kubectl") or "kubectl")
    ns = f"bench-prewarm-{secrets.token_hex(3)}"
    size = place_models(args.size)
    pv, pvc = harness.node_volume(ns, "weights", NODE, NODE_DIR)
    kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    kubectl("apply", "-f", "-", input=json.dumps(pv))
    try:
        for _ in range(150):
            if kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0:
                break
            await asyncio.sleep(0.2)
        a, b = MEMBERS
        router = harness.router_on_node(harness.router("bench", [a, b]), CONTROL_PLANE)
        harness.apply(kubectl, ns, pvc, member(a), member(b),
                      harness.pool("swap", [a, b], default=a, swap_budget="300s"), router)
        (pod,) = harness.wait_router_ready(kubectl, ns, "bench", None, 300.0)
        harness.wait_pool_ready(kubectl, ns, "swap", a, 300.0)
        url = harness.base_url(pod)
        samples: dict[bool, list[float]] = {True: [], False: []}
        drains: list[float] = []
        # With a drain: from the end of the generation in flight to the target's first event.
        after: dict[bool, list[float]] = {True: [], False: []}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
            await first_byte(s, url, a)
            resident = a
            for round_ in range(args.rounds):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for prewarm in order:
                    kubectl("patch", "modelpool", "swap", "-n", ns, "--type", "merge",
                            "-p", json.dumps({"spec": {"prewarm": prewarm}}))
                    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, "swap",
                                            resident, 60.0)
                    target = b if resident == a else a
                    busy = None
                    if args.drain_tokens:
                        started = asyncio.Event()
                        busy = asyncio.create_task(
                            in_flight(s, url, resident, args.drain_tokens, started))
                        await started.wait()
                    # The target's file leaves the page cache; the incumbent's mapped
                    # weights stay (drop_caches keeps mapped pages).
                    drop_caches()
                    asked = time.monotonic()
                    ttfb = await first_byte(s, url, target)
                    samples[prewarm].append(ttfb)
                    if busy is not None:
                        drained = await busy - asked
                        drains.append(drained)
                        after[prewarm].append(ttfb - drained)
                    resident = target
                    await asyncio.to_thread(harness.wait_pool_ready, kubectl, ns, "swap",
                                            resident, 120.0)
                    await asyncio.sleep(2.0)  # let the kubelet settle between swaps
        events = kubectl.json("get", "events", "-n", ns, "--field-selector",
                              "involvedObject.name=swap")["items"]
        prewarms = sum(e.get("count") or 1 for e in events if e.get("reason") == "Prewarming")
        load = os.getloadavg()[0]
        print(f"swap time to first byte, real llama-server members, {size / 1e6:.0f} MB of "
              f"models ({args.size}), page cache dropped before each swap, {args.rounds} "
              f"rounds alternated, load average {load:.1f}, {time.strftime('%Y-%m-%d %H:%M')}"
              + (f", a generation of {args.drain_tokens} tokens in flight on the incumbent "
                 f"(it ran on for a median {statistics.median(drains):.2f}s after the swap was "
                 "asked for)" if drains else "") + ":")
        print("| prewarm | n | p50 | mean | min | max |" + (" after the drain: p50 | mean |"
                                                          if drains else ""))
        print("| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if drains else ""))
        for prewarm in (False, True):
            v, w = samples[prewarm], after[prewarm]
            print(f"| {'on' if prewarm else 'off'} | {len(v)} | {pct(v, 50):.2f}s | "
                  f"{statistics.mean(v):.2f}s | {min(v):.2f}s | {max(v):.2f}s |"
                  + (f" {pct(w, 50):.2f}s | {statistics.mean(w):.2f}s |" if w else ""))
        ratio = statistics.median(samples[True]) / statistics.median(samples[False])
        print(f"p50 on / off: {ratio:.2f}; Prewarming Events: {prewarms}")
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kubectl("delete", "pv", f"{ns}-weights", "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
