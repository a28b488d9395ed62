"""A scale testbed: KWOK's fake GPU nodes and pods on the local testbed's control plane.

The local cluster (`e2e.local.controlplane`, brought up without its node agent) runs the
real kube-apiserver, etcd, controller manager and scheduler; KWOK (`e2e/kwok/build.sh`)
plays the kubelet of hundreds of nodes that advertise `nvidia.com/gpu`: it keeps their
Leases renewed, and makes every pod bound to one of them Running and Ready at once (and
gone at once when deleted), with an address from the cluster's pod network.

That network is a /16 of 127.0.0.0/8, which Linux routes to the loopback device as a
whole: every pod address is local with no route to add and no privilege, so one server
bound to 0.0.0.0 on the members' port (`e2e.kwok.standin`) answers the reconciler's probes
for every pod, and tells pods apart by the address it was reached at. No process runs per
pod, and what a pod answers is the stand-in's to decide.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.local import processes
from e2e.local.controlplane import LocalCluster
from e2e.local.paths import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "e2e" / "kwok" / "build.sh"
KWOK = "kwok"
# The label KWOK selects its nodes by, and the annotation kwokctl gives them.
NODE_LABEL = "modelpool.dev/kwok"
GPU_RESOURCE = "nvidia.com/gpu"
LEASE_SECONDS = 40


class KwokError(Exception):
    """KWOK could not be built or started; the message says where its log is."""


def build() -> Path:
    """Run the build script (a warm cache returns at once); its progress goes to stderr."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True,
                            check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise KwokError(f"{BUILD_SCRIPT} failed (exit {result.returncode})")
    return Path(lines[-1])


def node_name(index: int) -> str:
    return f"kwok-gpu-{index:04d}"


def node(index: int, gpus: int = 1, labels: Mapping[str, str] | None = None
         ) -> dict[str, Any]:
    """A fake node with `gpus` devices (and `labels` beside KWOK's own): KWOK initialises
    its status from this one."""
    name = node_name(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {NODE_LABEL: "true", "kubernetes.io/hostname": name,
                       "kubernetes.io/os": "linux", "type": "kwok", **(labels or {})},
            "annotations": {"kwok.x-k8s.io/node": "fake",
                            "node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110",
                            GPU_RESOURCE: str(gpus)},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110",
                         GPU_RESOURCE: str(gpus)},
        },
    }


def stages_config(kwok_binary: Path) -> str:
    """KWOK's --config: the stages copied beside the binary, as one YAML stream."""
    stages = sorted((kwok_binary.parent / "stages").glob("*.yaml"))
    if not stages:
        raise KwokError(f"no stages beside {kwok_binary}: run {BUILD_SCRIPT} again")
    return "\n---\n".join(p.read_text() for p in stages)


@dataclass(frozen=True)
class Kwok:
    """KWOK running against one local cluster; its pid and log live in the cluster's
    state directory, so the cluster's `down` stops it with the rest."""

    cluster: LocalCluster
    binary: Path

    @property
    def pid_file(self) -> Path:
        return self.cluster.layout.pid(KWOK)

    @property
    def log_file(self) -> Path:
        return self.cluster.layout.log(KWOK)

    def argv(self, config: Path) -> list[str]:
        return [
            str(self.binary),
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--config={config}",
            f"--manage-nodes-with-label-selector={NODE_LABEL}=true",
            f"--cidr={self.cluster.settings.pod_network}",
            "--node-ip=127.0.0.1",
            f"--node-lease-duration-seconds={LEASE_SECONDS}",
        ]

    def start(self) -> int:
        """Start KWOK unless it runs; its pid."""
        running = processes.running(self.pid_file)
        if running is not None:
            return running
        config = self.cluster.layout.root / "kwok.yaml"
        config.write_text(stages_config(self.binary))
        try:
            return processes.start(self.argv(config), self.pid_file, self.log_file,
                                   cwd=self.cluster.layout.root)
        except RuntimeError as e:
            raise KwokError(f"{e}; see {self.log_file}") from e

    def stop(self) -> None:
        processes.stop(self.pid_file, 10.0)
