"""The agent's settings, built once at the entry point from flags and the kubeconfig."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ApiServer:
    """How a pod's process reaches the API server: the address and CA (base64 PEM)."""

    server: str
    ca_data: str

    @property
    def ca_pem(self) -> bytes:
        return base64.b64decode(self.ca_data) if self.ca_data else b""


@dataclass(frozen=True)
class Timing:
    lease_seconds: int = 40
    lease_renew_seconds: float = 10.0
    node_status_seconds: float = 60.0
    volume_sync_seconds: float = 2.0
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 20.0
    poll_seconds: float = 0.5


@dataclass(frozen=True)
class AgentSettings:
    kubeconfig: str
    node_name: str
    gpus: int
    state_dir: Path
    python: str
    api_server: ApiServer
    # The environment every process starts from, as an image's own ENV would be.
    base_env: Mapping[str, str] = field(default_factory=dict)
    cpu: str = "8"
    memory: str = "32Gi"
    max_pods: int = 110
    host_ip: str = "127.0.0.1"
    pod_network: str = "127.0.0.0/16"
    unschedulable: bool = False
    timing: Timing = field(default_factory=Timing)

    @property
    def gpu_lock_dir(self) -> Path:
        return self.state_dir / "gpus"

    @property
    def pods_dir(self) -> Path:
        return self.state_dir / "pods"


def api_server_from_kubeconfig(config: Mapping[str, Any], base: Path) -> ApiServer:
    """The current context's cluster address and CA from a parsed kubeconfig (a CA given
    as a file is read relative to the kubeconfig's directory)."""
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    current = config.get("current-context") or next(iter(contexts), "")
    cluster = clusters[contexts[current]["cluster"]] if current in contexts else next(
        iter(clusters.values())
    )
    ca_data = str(cluster.get("certificate-authority-data", ""))
    if not ca_data and cluster.get("certificate-authority"):
        ca_path = base / str(cluster["certificate-authority"])
        ca_data = base64.b64encode(ca_path.read_bytes()).decode()
    return ApiServer(server=str(cluster["server"]), ca_data=ca_data)
