"""Two reconciler processes on one Lease: one leads, the other takes over when it dies.

The reconcilers run as real processes (`python -m reconciler run --leader-elect`), as the
node agent would run the `modelpool/reconciler` image; the leader is killed with SIGKILL,
so it cannot hand the Lease over: the standby must wait it out, then finish the work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kr8s.asyncio
import pytest

from reconciler.kube import LEASES, MODEL_POOLS, Kube
from reconciler.timefmt import parse
from tests.integration.test_reconciler import (
    Json,
    _free_port,
    apply,
    crds,  # noqa: F401  (a fixture)
    eventually,
    pool,
    replicas,
    server,
)

pytestmark = pytest.mark.integration

LEASE = "modelpool-reconciler"


class Replica:
    def __init__(self, name: str, namespace: str, kubeconfig: Path, log_dir: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.log = log_dir / f"{name}.log"
        env = {**os.environ, "POD_NAME": name, "MODELPOOL_BIND_HOST": "127.0.0.1"}
        argv = [sys.executable, "-m", "reconciler", "run", "--namespace", namespace,
                "--leader-elect", "--lease-namespace", namespace, "--lease-duration", "3",
                "--kubeconfig", str(kubeconfig), "--metrics-port", str(self.port),
                "--probe-interval", "0.5"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    async def metric(self, name: str) -> float | None:
        try:
            async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{self.port}/metrics"
            ) as response:
                text = await response.text()
        except aiohttp.ClientError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


@pytest.fixture
def replicas_pair(
    crds: None, namespace: str, kubeconfig: Path, tmp_path: Path  # noqa: F811
) -> Iterator[dict[str, Replica]]:
    pair = {n: Replica(n, namespace, kubeconfig, tmp_path) for n in ("r1", "r2")}
    try:
        yield pair
    finally:
        for replica in pair.values():
            replica.stop()
        for replica in pair.values():
            sys.stderr.write(f"--- {replica.name}\n{replica.log.read_text()[-3000:]}\n")


async def _holder(kube: Kube, namespace: str) -> str | None:
    lease = await kube.get(LEASES, namespace, LEASE)
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


async def _resident(kube: Kube, namespace: str, member: str) -> Json | None:
    body = await kube.request("GET", MODEL_POOLS, namespace, "slot")
    status = body.get("status") or {}
    ok = status.get("phase") == "Ready" and status.get("residentMember") == member
    return body if ok else None


async def test_killing_the_leader_hands_over_and_a_swap_still_completes(
    replicas_pair: dict[str, Replica], kubectl: Any, namespace: str, api: kr8s.asyncio.Api
) -> None:
    kube = Kube(api)
    leader_name = await eventually(lambda: _holder(kube, namespace), "a leader", 30)
    leader = replicas_pair[leader_name]
    standby = replicas_pair["r2" if leader_name == "r1" else "r1"]
    assert await eventually(lambda: leader.metric("modelpool_reconciler_leader"),
                            "the leader's metrics", 20) == 1
    assert await eventually(lambda: standby.metric("modelpool_reconciler_leader"),
                            "the standby's metrics", 20) == 0

    apply(kubectl, namespace, server("a"), server("b"), pool(["a", "b"]))
    await eventually(lambda: _resident(kube, namespace, "a"), "a resident", 60)

    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(10)
    last_renewal = parse(((await kube.get(LEASES, namespace, LEASE)) or {})["spec"]["renewTime"])
    assert last_renewal is not None
    body = await kube.request("GET", MODEL_POOLS, namespace, "slot")
    ops = [{"op": "test", "path": "/metadata/resourceVersion",
            "value": body["metadata"]["resourceVersion"]},
           {"op": "add", "path": "/status/request",
            "value": {"member": "b", "generation": 1, "requestedBy": "test"}}]
    await kube.json_patch_status(MODEL_POOLS, namespace, "slot", ops)

    async def taken_over() -> str | None:
        holder = await _holder(kube, namespace)
        return holder if holder == standby.name else None

    await eventually(taken_over, "the standby to take the Lease", 30)
    lease = await kube.get(LEASES, namespace, LEASE)
    acquired = parse((lease or {})["spec"]["acquireTime"])
    assert acquired is not None
    assert acquired - last_renewal >= 3.0, "the Lease was taken before it expired"
    body = await eventually(lambda: _resident(kube, namespace, "b"), "b resident", 60)
    assert body["status"]["lastSwap"]["generation"] == 1
    assert replicas(kubectl, namespace, "a") == 0

    # a graceful stop hands the Lease back at once and exits 0
    standby.process.send_signal(signal.SIGTERM)
    assert standby.process.wait(30) == 0
    assert await _holder(kube, namespace) is None
    lines = [json.loads(line) for line in standby.log.read_text().splitlines()
             if line.startswith("{")]
    assert any(line["message"] == "released the Lease" for line in lines)
