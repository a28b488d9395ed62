"""Where the e2e tier runs: on kind (a real kubelet, containerd and CNI, e2e/kind/) or on
the local testbed (a real control plane and a node agent, e2e/local/).

A `Testbed` is what a test needs of either beyond `kubectl`:

- `install(namespace)` gives the test a reconciler acting on its namespace, and
  `uninstall(installation)` takes back what that added. On the local testbed it is a
  reconciler Deployment scoped to the namespace (several suites share that cluster, each
  with reconcilers of its own). On kind it is the cluster-wide reconciler that
  `e2e/kind/up.sh` installed from `overlays/kind`, re-applied and waited for: kind's
  cluster belongs to the e2e tier, and a scoped one beside it would be a second actor.
- `kill(pod)` sends SIGKILL to the process of the pod's first container, out of band (the
  node agent's child on the local testbed; on kind the container's process inside its
  node, found with `crictl`).
- `pod_kubeconfig(pod, directory)` a kubeconfig with the credentials the pod itself runs
  with (the node agent's file; on kind the ServiceAccount token mounted in the pod, read
  through `kubectl exec`).
- `namespace_labels` the Pod Security level its test namespaces enforce: `restricted` on
  kind, where a real kubelet checks what it admits; `baseline` on the local testbed.

Which one: `MODELPOOL_E2E_TESTBED` (`kind` or `local`); unset, kind when
`MODELPOOL_KIND_KUBECONFIG` names a cluster (the README's test command brings one up and
sets it), else the local testbed. A test module that only the local testbed can host says
so with a module-level `TESTBED = "local"` and the reason beside it.

`MODELPOOL_KIND_KUBECONFIG` may name several clusters, joined by ':' as KUBECONFIG is: the
kind lane runs on two pytest-xdist workers, and worker N takes the Nth (`kind_kubeconfig`);
any other process takes the first. `kind_cluster()` is that cluster's name, whose nodes are
`<name>-control-plane`, `<name>-worker` (one fake GPU) and `<name>-worker2` (two).
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from e2e import harness
from e2e.harness import Installation, KubectlLike, Pod

KIND = "kind"
LOCAL = "local"
KIND_OVERLAY = harness.REPO_ROOT / "overlays" / "kind"
KIND_UP = harness.REPO_ROOT / "e2e" / "kind" / "up.sh"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def chosen(module_choice: str | None = None) -> str:
    """The testbed of this run (see the module docstring); a module's own choice wins."""
    if module_choice is not None:
        return module_choice
    configured = os.environ.get("MODELPOOL_E2E_TESTBED", "").strip()
    if configured:
        if configured not in (KIND, LOCAL):
            raise ValueError(f"MODELPOOL_E2E_TESTBED={configured!r}: expected kind or local")
        return configured
    return KIND if os.environ.get("MODELPOOL_KIND_KUBECONFIG") else LOCAL


_kind_kubeconfig: list[Path] = []
DEFAULT_KIND_CLUSTER = "modelpool"


def worker_index() -> int:
    """This pytest-xdist worker's number (`gw1` is 1), 0 in a process that is none."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = worker.removeprefix("gw")
    return int(number) if worker.startswith("gw") and number.isdigit() else 0


def configured_kind_kubeconfig() -> Path | None:
    """The kubeconfig MODELPOOL_KIND_KUBECONFIG names for this process (see the module
    docstring), None when it names none."""
    paths = [p for p in os.environ.get("MODELPOOL_KIND_KUBECONFIG", "").split(os.pathsep) if p]
    return Path(paths[worker_index() % len(paths)]) if paths else None


def kind_kubeconfig() -> Path:
    """The kind cluster's kubeconfig: the one MODELPOOL_KIND_KUBECONFIG names for this
    process, else `e2e/kind/up.sh` brings the cluster up (once per session) and prints it."""
    configured = configured_kind_kubeconfig()
    if configured is not None:
        return configured
    if not _kind_kubeconfig:
        result = subprocess.run(["bash", str(KIND_UP)], stdout=subprocess.PIPE, text=True,
                                timeout=3600, check=False)
        if result.returncode != 0:
            raise AssertionError(f"{KIND_UP} failed (exit {result.returncode})")
        _kind_kubeconfig.append(Path(result.stdout.strip().splitlines()[-1]))
    return _kind_kubeconfig[0]


def kind_cluster() -> str:
    """The name of the kind cluster this process tests on: from its kubeconfig's context
    (`kind-<name>`), else `modelpool` (the cluster up.sh makes when none is named yet)."""
    configured = configured_kind_kubeconfig()
    if configured is None or not configured.is_file():
        return DEFAULT_KIND_CLUSTER
    context = str((yaml.safe_load(configured.read_text()) or {}).get("current-context", ""))
    return context.removeprefix("kind-") if context.startswith("kind-") else DEFAULT_KIND_CLUSTER


class Testbed(Protocol):
    name: str
    namespace_security: str

    def install(self, namespace: str) -> Installation: ...

    def uninstall(self, installation: Installation) -> None: ...

    def kill(self, pod: Pod) -> None: ...

    def pod_kubeconfig(self, pod: Pod, directory: Path) -> Path: ...


@dataclass
class LocalTestbed:
    kubectl: KubectlLike
    node_state_dir: Path
    name: str = LOCAL
    namespace_security: str = "baseline"

    def install(self, namespace: str) -> Installation:
        return harness.install(self.kubectl, scope=namespace)

    def uninstall(self, installation: Installation) -> None:
        if installation.scope is not None:
            harness.uninstall_scope(self.kubectl, installation.scope)

    def kill(self, pod: Pod) -> None:
        if pod.pid is None:
            raise AssertionError(f"pod {pod.namespace}/{pod.name} has no process yet")
        os.kill(pod.pid, signal.SIGKILL)

    def pod_kubeconfig(self, pod: Pod, directory: Path) -> Path:
        config = harness.pod_kubeconfig(self.node_state_dir, pod)
        if not config.is_file():
            raise AssertionError(f"the node agent wrote no kubeconfig at {config}")
        return config


@dataclass
class KindTestbed:
    kubectl: KubectlLike
    name: str = KIND
    namespace_security: str = "restricted"

    def install(self, namespace: str) -> Installation:
        return harness.install(self.kubectl, overlay=KIND_OVERLAY)

    def uninstall(self, installation: Installation) -> None:
        """The cluster-wide install stays, as up.sh left it."""

    def kill(self, pod: Pod) -> None:
        obj = harness.get(self.kubectl, pod.namespace, "pod", pod.name)
        node = obj["spec"]["nodeName"]
        statuses = obj["status"].get("containerStatuses") or []
        container = str(statuses[0].get("containerID") or "") if statuses else ""
        if not container.startswith("containerd://"):
            raise AssertionError(f"pod {pod.namespace}/{pod.name} has no container yet")
        pid = subprocess.run(
            ["docker", "exec", node, "crictl", "inspect", "--output", "go-template",
             "--template", "{{.info.pid}}", container.removeprefix("containerd://")],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()
        subprocess.run(["docker", "exec", node, "kill", "-KILL", pid],
                       capture_output=True, text=True, timeout=30, check=True)

    def pod_kubeconfig(self, pod: Pod, directory: Path) -> Path:
        token = self.kubectl("exec", "-n", pod.namespace, pod.name, "--", "cat",
                             TOKEN_PATH).stdout.strip()
        admin = yaml.safe_load(self.kubectl("config", "view", "--raw", "--minify").stdout)
        cluster = admin["clusters"][0]["cluster"]
        ca = cluster.get("certificate-authority-data") or base64.b64encode(
            Path(cluster["certificate-authority"]).read_bytes()).decode()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "kind", "cluster": {
                "server": cluster["server"], "certificate-authority-data": ca}}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "kind", "user": "pod"}}],
        }
        path = directory / f"{pod.name}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path
