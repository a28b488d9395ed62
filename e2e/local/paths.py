"""Where a local cluster keeps its files.

Every file of one cluster (certificates, kubeconfigs, etcd's data, logs, pid files, the
node agent's pods) lives under one state directory, so `down` can remove all of it and
two clusters in two directories never share anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "e2e" / "build-control-plane.sh"


def default_state_dir(env: Mapping[str, str], home: Path) -> Path:
    """`$XDG_STATE_HOME/modelpool/local`, else `~/.local/state/modelpool/local`."""
    base = env.get("XDG_STATE_HOME") or str(home / ".local" / "state")
    return Path(base) / "modelpool" / "local"


@dataclass(frozen=True)
class StateLayout:
    """The paths of one cluster's state directory."""

    root: Path

    @property
    def config(self) -> Path:
        """The cluster's settings (ports, binaries, node), written once by `up`."""
        return self.root / "cluster.json"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def node_state(self) -> Path:
        """The node agent's own directory (pods' files, GPU locks)."""
        return self.root / "node"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def sa_public_key(self) -> Path:
        return self.pki / "sa.pub"

    @property
    def sa_private_key(self) -> Path:
        return self.pki / "sa.key"

    def kubeconfig(self, component: str) -> Path:
        return self.root / f"{component}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid(self, component: str) -> Path:
        return self.run / f"{component}.pid"

    def cert(self, name: str) -> Path:
        return self.pki / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.pki / f"{name}.key"
