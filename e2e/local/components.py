"""The command lines of the cluster's components, as pure functions of its settings.

Flags are kept lean for a 2-core machine: one etcd member without fsync, an API server
without priority and fairness, a controller manager running only the controllers the
project's behaviour rests on, no leader election. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2e.local.paths import StateLayout

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
NODE_NAME = "modelpool-node"

# The controllers that Deployments, Services, service accounts, garbage collection and
# node health need. The legacy Endpoints controller is left out: core/v1 Endpoints
# reject the loopback addresses that the testbed's pods have, and nothing here reads
# them (EndpointSlices are what the router and kube-proxy read).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "endpointslice-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "namespace-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
    "job-controller",
)


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class ClusterSettings:
    """What `up` decided once and every later command reads back from the state dir."""

    bin_dir: Path
    ports: Ports
    gpus: int
    # Each cluster's pods get addresses from their own /16 of 127.0.0.0/8, so two
    # clusters on one machine (a shared one and a test session's) never share one.
    pod_network: str = "127.1.0.0/16"
    node_name: str = NODE_NAME
    with_node: bool = True
    # The controller manager's and the scheduler's client rate limit (`--kube-api-qps`,
    # burst half as much again); None keeps their defaults (20 and 50 a second).
    api_qps: int | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def to_json(self) -> str:
        data = asdict(self)
        data["bin_dir"] = str(self.bin_dir)
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterSettings:
        data: dict[str, Any] = json.loads(text)
        return cls(
            bin_dir=Path(data["bin_dir"]),
            ports=Ports(**data["ports"]),
            gpus=int(data["gpus"]),
            pod_network=str(data.get("pod_network", "127.1.0.0/16")),
            node_name=str(data["node_name"]),
            with_node=bool(data["with_node"]),
            api_qps=None if data.get("api_qps") is None else int(data["api_qps"]),
        )


@dataclass(frozen=True)
class Component:
    """One process of the cluster: its name (also of its log and pid files) and argv."""

    name: str
    argv: tuple[str, ...]


def random_pod_network() -> str:
    """A /16 of loopback that is neither 127.0.0.0/16 (the control plane's) nor reserved."""
    return f"127.{secrets.randbelow(240) + 10}.0.0/16"


def etcd(layout: StateLayout, s: ClusterSettings) -> Component:
    client = f"http://127.0.0.1:{s.ports.etcd_client}"
    peer = f"http://127.0.0.1:{s.ports.etcd_peer}"
    return Component(
        "etcd",
        (
            str(s.bin_dir / "etcd"),
            "--name=local",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ),
    )


def apiserver(layout: StateLayout, s: ClusterSettings) -> Component:
    return Component(
        "kube-apiserver",
        (
            str(s.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{s.ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={s.ports.apiserver}",
            f"--cert-dir={layout.pki}",
            f"--tls-cert-file={layout.cert('apiserver')}",
            f"--tls-private-key-file={layout.key('apiserver')}",
            f"--client-ca-file={layout.cert('ca')}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={layout.sa_public_key}",
            f"--service-account-signing-key-file={layout.sa_private_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Nothing routes to the `kubernetes` Service here (no kube-proxy), and its
            # Endpoints would hold the loopback address, which core/v1 rejects.
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
        ),
    )


def client_rate(s: ClusterSettings) -> tuple[str, ...]:
    """A client rate limit's flags, when the settings raise it."""
    if s.api_qps is None:
        return ()
    return (f"--kube-api-qps={s.api_qps}", f"--kube-api-burst={s.api_qps * 3 // 2}")


def controller_manager(layout: StateLayout, s: ClusterSettings) -> Component:
    return Component(
        "kube-controller-manager",
        (
            str(s.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={s.ports.controller_manager}",
            f"--cert-dir={layout.pki}",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={layout.sa_private_key}",
            f"--root-ca-file={layout.cert('ca')}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--profiling=false",
            *client_rate(s),
        ),
    )


def scheduler(layout: StateLayout, s: ClusterSettings) -> Component:
    return Component(
        "kube-scheduler",
        (
            str(s.bin_dir / "kube-scheduler"),
            f"--kubeconfig={layout.kubeconfig('kube-scheduler')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={s.ports.scheduler}",
            f"--cert-dir={layout.pki}",
            "--leader-elect=false",
            "--profiling=false",
            *client_rate(s),
        ),
    )


def node_agent(layout: StateLayout, s: ClusterSettings, python: str) -> Component:
    return Component(
        "node-agent",
        (
            python,
            "-m",
            "e2e.local.node_agent",
            f"--kubeconfig={layout.admin_kubeconfig}",
            f"--node-name={s.node_name}",
            f"--gpus={s.gpus}",
            f"--state-dir={layout.node_state}",
            f"--pod-network={s.pod_network}",
        ),
    )


def control_plane(layout: StateLayout, s: ClusterSettings) -> tuple[Component, ...]:
    """The control plane in start order (the reverse is the stop order)."""
    return (
        etcd(layout, s),
        apiserver(layout, s),
        controller_manager(layout, s),
        scheduler(layout, s),
    )
