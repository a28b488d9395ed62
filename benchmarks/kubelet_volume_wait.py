"""How long a real kubelet waits before it creates a pod's sandbox, with and without a
volume: the cost of `WaitForAttachAndMount` in the kubelet's `SyncPod`.

On the kind cluster of e2e/kind/up.sh (MODELPOOL_KIND_KUBECONFIG), pods are created one at
a time straight onto a worker node (`spec.nodeName`, so no scheduler is in the path), in
turn with no volume and with one emptyDir, like a member's `/tmp`. For each one the time
from `kubectl create` returning to containerd's `RunPodSandbox` on the node (its journal;
the nodes are containers on this machine, one clock) is recorded. kubectl exits a little
after the API server answers, so the figures start late by the same amount for both
kinds; their difference is what the volume costs.

    MODELPOOL_KIND_KUBECONFIG=... .venv/bin/python benchmarks/kubelet_volume_wait.py --pods 10
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for entry in (REPO, REPO / "benchmarks"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import bench_swap_kind  # noqa: E402

from e2e import harness  # noqa: E402
from e2e.local.demo import Kubectl  # noqa: E402

NODE = "modelpool-worker"
IMAGE = "modelpool/fake-model:e2e"


def pod(name: str, volume: bool) -> harness.Json:
    container: harness.Json = {
        "name": "c", "image": IMAGE, "imagePullPolicy": "Never",
        "command": ["python3", "-c", "import time; time.sleep(600)"],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "runAsUser": 1000, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    spec: harness.Json = {"nodeName": NODE, "containers": [container],
                          "automountServiceAccountToken": False,
                          "terminationGracePeriodSeconds": 0}
    if volume:
        container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
        spec["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def sandbox_started(name: str, since_wall: float) -> float | None:
    """When containerd was asked for `name`'s sandbox (wall clock), from the node's journal."""
    out = subprocess.run(
        ["docker", "exec", NODE, "journalctl", "-u", "containerd", "--since",
         f"@{since_wall:.3f}", "-o", "json", "--no-pager"],
        check=True, capture_output=True, text=True).stdout
    for raw in out.splitlines():
        entry = json.loads(raw)
        message = entry.get("MESSAGE")
        if isinstance(message, str) and "RunPodSandbox for" in message and name in message:
            return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=10, help="pods of each kind")
    args = parser.parse_args()
    kubectl = Kubectl(bench_swap_kind.kubeconfig(), shutil.which("kubectl") or "kubectl")
    ns = f"volume-wait-{secrets.token_hex(3)}"
    kubectl("create", "namespace", ns)
    waits: dict[str, list[float]] = {"no volume": [], "one emptyDir": []}
    counters = bench_swap_kind.cpu_times()
    try:
        for i in range(args.pods):
            for label, volume in (("no volume", False), ("one emptyDir", True)):
                name = f"{'vol' if volume else 'none'}-{i}"
                body = json.dumps(pod(name, volume))
                kubectl("create", "-n", ns, "-f", "-", input=body)
                # kubectl has exited, after the API server answered: a little late, the same
                # for both kinds, so their difference is the volume's cost
                created = time.time()
                harness.eventually(
                    lambda n=name: kubectl("get", "pod", n, "-n", ns, "-o",
                                           "jsonpath={.status.phase}").stdout == "Running"
                    or None, f"pod {name} Running", 60)
                started = harness.eventually(
                    lambda n=name, t=created: sandbox_started(n, t - 1), f"{name}'s sandbox",
                    30)
                waits[label].append(started - created)
                kubectl("delete", "pod", name, "-n", ns, "--wait=true")
        steal = bench_swap_kind.steal_percent(counters, bench_swap_kind.cpu_times())
        print(f"created to RunPodSandbox on {NODE}, {args.pods} pods each "
              f"(load average {os.getloadavg()[0]:.1f}, CPU steal {steal:.0f}%):")
        for label, values in waits.items():
            print(f"  {label:>12}: p50 {statistics.median(values):.3f}s  "
                  f"min {min(values):.3f}s  max {max(values):.3f}s  "
                  "each " + " ".join(f"{v:.2f}" for v in values))
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
