"""How soon a change to a ModelRouter reaches its router on kind: through the API (the
router follows its ConfigMap with a watch) against the kubelet's refresh of the same
ConfigMap mounted as a file (what a router that polled its file would wait for).

The kind cluster of e2e/kind/up.sh (MODELPOOL_KIND_KUBECONFIG, else up.sh is run): a
ModelRouter with one URL backend on the control-plane node. Each change gives the backend a
new alias with `kubectl apply`; timed from just before the apply (so kubectl's own time is
inside both figures), two watchers run side by side until each sees the alias:

- the router: a chat request for the alias every 50 ms, until it is routed (a 502 from the
  backend's closed port) rather than refused as an unknown model (404);
- the file: `kubectl exec ... cat` of the mounted config every second, until it names it.

    .venv/bin/python benchmarks/config_propagation_kind.py --changes 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_swap_kind import CONTROL_PLANE, kubeconfig, pct  # noqa: E402
from e2e import harness  # noqa: E402
from e2e.local.fixtures import Kubectl  # noqa: E402

CONFIG_FILE = "/etc/modelpool/router/config.json"


def edge_router(alias: str) -> harness.Json:
    router = harness.router("edge", ["ext"])
    router["spec"]["backends"] = [{"name": "ext", "url": "http://127.0.0.1:9",
                                   "aliases": [alias]}]
    return harness.router_on_node(router, CONTROL_PLANE)


async def routed(session: aiohttp.ClientSession, url: str, alias: str, start: float,
                 limit: float) -> float:
    """Seconds from `start` until the router routes `alias` (anything but its 404 for an
    unknown model)."""
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    while time.monotonic() - start < limit:
        async with session.post(url + "/chat/completions", json=body) as r:
            await r.read()
            if r.status != 404:
                return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise SystemExit(f"the router did not route {alias} within {limit:g}s")


async def in_file(kubectl: Kubectl, ns: str, pod: str, alias: str, start: float,
                  limit: float) -> float:
    """Seconds from `start` until the config file mounted in `pod` names `alias`."""
    while time.monotonic() - start < limit:
        done = await asyncio.to_thread(
            kubectl, "exec", "-n", ns, pod, "--", "cat", CONFIG_FILE, check=False)
        if alias in done.stdout:
            return time.monotonic() - start
        await asyncio.sleep(1.0)
    raise SystemExit(f"the kubelet did not write {alias} into {CONFIG_FILE} within {limit:g}s")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds to wait, each")
    args = parser.parse_args()
    kubectl = Kubectl(kubeconfig(), shutil.which("kubectl") or "kubectl")
    ns = f"bench-config-{secrets.token_hex(3)}"
    kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    api: list[float] = []
    files: list[float] = []
    try:
        harness.apply(kubectl, ns, edge_router("alias-0"))
        (pod,) = harness.wait_router_ready(kubectl, ns, "edge", None, 180.0)
        url = harness.base_url(pod)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await routed(session, url, "alias-0", time.monotonic(), args.limit)
            for change in range(1, args.changes + 1):
                alias = f"alias-{change}"
                start = time.monotonic()
                harness.apply(kubectl, ns, edge_router(alias))
                through_api, through_file = await asyncio.gather(
                    routed(session, url, alias, start, args.limit),
                    in_file(kubectl, ns, pod.name, alias, start, args.limit))
                api.append(through_api)
                files.append(through_file)
                print(f"change {change}: routed after {through_api:.2f}s, in the mounted file "
                      f"after {through_file:.1f}s", file=sys.stderr)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
    print(f"a ModelRouter change reaching its router on kind, {len(api)} changes:")
    print("| path | p50 | max | mean |")
    print("| --- | --- | --- | --- |")
    for name, values in (("the router, following its ConfigMap through the API", api),
                         ("the mounted file, refreshed by the kubelet", files)):
        print(f"| {name} | {pct(values, 50):.2f}s | {max(values):.2f}s | "
              f"{statistics.mean(values):.2f}s |")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
