"""pytest fixtures for tests against the local cluster.

`tests/conftest.py` imports them, and any other conftest (e2e/tests) can do the same:

    from e2e.local.fixtures import api, cluster, kubeconfig, kubectl, namespace  # noqa: F401

- `cluster` (session): reuses the running cluster of the default state directory (or
  `$MODELPOOL_STATE_DIR`) when `MODELPOOL_REUSE_CLUSTER=1` and it is healthy; otherwise
  starts one in a fresh temporary directory and takes it down at the end of the session.
- `kubeconfig`, `kubectl`, `api` (async, a kr8s client bound to the test's event loop),
  `namespace` (fresh per test, deleted after it without waiting).

Only tests marked `integration` or `e2e` may use the cluster; `check_tiers` enforces it at
collection time, so a unit test can never start one by accident.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from e2e import kube_reads
from e2e.local import controlplane
from e2e.local.paths import REPO_ROOT, default_state_dir
from kubecore.client import opened

CLUSTER_TIERS = ("integration", "e2e")
TIERS = ("unit", "functional", *CLUSTER_TIERS)
# Tests in these directories get the tier marker when they have none.
DIRECTORY_TIERS = {
    REPO_ROOT / "tests" / "unit": "unit",
    REPO_ROOT / "tests" / "functional": "functional",
    REPO_ROOT / "tests" / "integration": "integration",
    REPO_ROOT / "e2e" / "tests": "e2e",
    REPO_ROOT / "e2e" / "kind_tests": "e2e",
}
# ...and these may hold no other tier, so that `pytest -m unit` and `pytest tests/unit`
# (or -m functional and tests/functional) select the same tests. The cluster tiers keep
# the pure checks of their own helpers beside them, marked unit.
STRICT_DIRECTORIES = (REPO_ROOT / "tests" / "unit", REPO_ROOT / "tests" / "functional")
# Pod Security level enforced in each test namespace. `baseline` admits the model
# servers' stock images (llama.cpp and vLLM run as root); it still refuses privileged pods.
NAMESPACE_POD_SECURITY = "baseline"


def mark_by_directory(items: Sequence[pytest.Item]) -> None:
    """Give tests under tests/integration and e2e/tests their tier when they have none."""
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        path = Path(str(item.path)).resolve()
        for directory, tier in DIRECTORY_TIERS.items():
            if path.is_relative_to(directory):
                item.add_marker(getattr(pytest.mark, tier))
                break


def _strict_tier(item: pytest.Item) -> str | None:
    path = Path(str(item.path)).resolve()
    strict = (d for d in STRICT_DIRECTORIES if path.is_relative_to(d))
    return next((DIRECTORY_TIERS[d] for d in strict), None)


def check_tiers(items: Sequence[pytest.Item]) -> None:
    """Refuse a test that reaches the cluster without being marked integration or e2e, and
    one whose tier is not its directory's."""
    misplaced = [
        f"{item.nodeid} ({', '.join(marked)})"
        for item in items
        if (tier := _strict_tier(item)) is not None
        and (marked := [t for t in TIERS if item.get_closest_marker(t)]) != [tier]
    ]
    if misplaced:
        raise pytest.UsageError(
            "these tests are marked with a tier other than their directory's: "
            + ", ".join(misplaced)
        )
    offenders = [
        item.nodeid
        for item in items
        # Every cluster fixture requests `cluster`, so it is in the closure of any of them.
        if "cluster" in getattr(item, "fixturenames", ())
        and not any(item.get_closest_marker(tier) for tier in CLUSTER_TIERS)
    ]
    if offenders:
        raise pytest.UsageError(
            "these tests use the cluster but are not marked integration or e2e: "
            + ", ".join(offenders)
        )


class _SessionCluster:
    """The one cluster of this pytest process.

    tests/conftest.py and e2e/tests/conftest.py both import the `cluster` fixture, which
    makes two session fixtures; both hand out this one cluster, and the last to finish
    takes it down (when it was started here rather than reused).
    """

    def __init__(self) -> None:
        self.cluster: controlplane.LocalCluster | None = None
        self.owned = False
        self.users = 0

    def acquire(self, tmp_path_factory: pytest.TempPathFactory) -> controlplane.LocalCluster:
        if self.cluster is None:
            self.cluster, self.owned = _reused_or_new(tmp_path_factory)
        self.users += 1
        return self.cluster

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.cluster is not None:
            if self.owned:
                controlplane.down(self.cluster.state_dir)
            self.cluster = None


def _reused_or_new(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[controlplane.LocalCluster, bool]:
    env = os.environ
    if env.get("MODELPOOL_REUSE_CLUSTER") == "1":
        state = Path(env.get("MODELPOOL_STATE_DIR") or default_state_dir(env, Path.home()))
        running = controlplane.healthy(state)
        if running is not None:
            return running, False
    state = tmp_path_factory.mktemp("cluster", numbered=True)
    options = controlplane.UpOptions(state_dir=state, python=sys.executable, gpus=1)
    try:
        return controlplane.up(options), True
    except BaseException:
        controlplane.down(state)
        raise


_SESSION = _SessionCluster()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.LocalCluster]:
    """The local cluster: a running one when asked to reuse it, else a fresh one."""
    shared = _SESSION.acquire(tmp_path_factory)
    try:
        yield shared
    finally:
        _SESSION.release()


def private_cluster(prefix: str) -> Any:
    """A module-scoped `cluster` fixture that starts a cluster of the module's own, whatever
    MODELPOOL_REUSE_CLUSTER says: for tests that restart the control plane or install a
    cluster-wide reconciler. Use as `cluster = private_cluster("soak-cluster")`."""

    @pytest.fixture(scope="module", name="cluster")
    def _cluster(
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[controlplane.LocalCluster]:
        state = tmp_path_factory.mktemp(prefix, numbered=True)
        options = controlplane.UpOptions(state_dir=state, python=sys.executable, gpus=1)
        try:
            yield controlplane.up(options)
        finally:
            controlplane.down(state)

    return _cluster


@pytest.fixture
def kubeconfig(cluster: controlplane.LocalCluster) -> Path:
    return cluster.kubeconfig


class Kubectl:
    """Runs kubectl against the cluster: `kubectl("get", "pods", "-n", ns)`. Its `json`
    reads answer `get` in this process where they can (e2e.kube_reads: the same output, no
    process per read), and run kubectl for every other shape."""

    def __init__(self, kubeconfig: Path, binary: str, *, in_process: bool = True) -> None:
        self.kubeconfig = kubeconfig
        self.binary = binary
        self.reads = kube_reads.Reads(kubeconfig) if in_process else None

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        argv = [self.binary, f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def json(self, *args: str) -> Any:
        """`kubectl get ... -o json`, parsed."""
        if self.reads is not None:
            try:
                answered = self.reads.get(args)
            except kube_reads.Failed as e:
                raise AssertionError(f"kubectl {' '.join(args)} exited 1: {e}") from None
            if answered is not None:
                return answered
        return json.loads(self(*args, "-o", "json").stdout)

    def json_or_none(self, *args: str) -> Any | None:
        """`json(*args)`, or None where kubectl would exit non-zero (the object is absent,
        mostly): the check of a wait that asks whether something exists yet."""
        try:
            return self.json(*args)
        except AssertionError:  # how `json` says kubectl exited non-zero
            return None

    def create_namespace(self, manifest: dict[str, Any]) -> None:
        """`kubectl create` of a Namespace, in this process where it can be."""
        refused = self.refusal(None, manifest)
        if refused is not None:
            raise AssertionError(f"kubectl create namespace exited 1: {refused}")

    def refusal(self, namespace: str | None, manifest: dict[str, Any]) -> str | None:
        """`kubectl create [-n NAMESPACE] -f -` of `manifest`, in this process where it can
        be: None when the object was created, else the API server's refusal in kubectl's
        frame (`Error from server (Invalid): ModelPool.modelpool.dev "p" is invalid: ...`;
        kubectl itself names an invalid object `The ModelPool "p"`)."""
        if self.reads is not None:
            try:
                self.reads.create_in(namespace, manifest)
                return None
            except kube_reads.Failed as e:
                return str(e)
            except kube_reads.Unsupported:
                pass
        where = ("-n", namespace) if namespace else ()
        result = self("create", *where, "-f", "-", input=json.dumps(manifest), check=False)
        return None if result.returncode == 0 else result.stderr

    def delete_namespace(self, name: str) -> None:
        """`kubectl delete namespace NAME --wait=false --ignore-not-found`, errors ignored."""
        if self.reads is not None:
            try:
                self.reads.delete(f"/api/v1/namespaces/{name}")
                return
            except (kube_reads.Unsupported, kube_reads.Failed):
                pass
        self("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def kubectl(kubeconfig: Path, cluster: controlplane.LocalCluster) -> Kubectl:
    # The build script makes a kubectl of the cluster's own release; any other will do.
    built = cluster.bin_dir / "kubectl"
    binary = str(built) if built.exists() else shutil.which("kubectl") or "kubectl"
    return Kubectl(kubeconfig, binary)


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[Any]:
    """A kr8s client of this test's event loop, closed and forgotten after the test."""
    async with kr8s_client(kubeconfig) as client:
        yield client


def kr8s_client(kubeconfig: Path) -> contextlib.AbstractAsyncContextManager[Any]:
    """A kr8s client of the running event loop for `kubeconfig`, closed and forgotten after."""
    return opened(str(kubeconfig))


def _namespace_name(nodeid: str) -> str:
    test = nodeid.rsplit("::", 1)[-1]
    slug = re.sub(r"[^a-z0-9]+", "-", test.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def fresh_namespace(kubectl: Kubectl, nodeid: str,
                   security: str = NAMESPACE_POD_SECURITY) -> Iterator[str]:
    """A fresh namespace for the test `nodeid`, enforcing Pod Security `security`, once its
    default ServiceAccount exists (so pods can be created); deleted after, without waiting."""
    name = _namespace_name(nodeid)
    labels = {"pod-security.kubernetes.io/enforce": security, "modelpool.dev/test": "true"}
    if security == "restricted":
        labels["pod-security.kubernetes.io/enforce-version"] = "latest"
    manifest = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels}}
    kubectl.create_namespace(manifest)
    try:
        deadline = time.monotonic() + 30.0
        while kubectl.json_or_none("get", "serviceaccount", "default", "-n", name) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"namespace {name} got no default ServiceAccount in 30s")
            time.sleep(0.2)  # the poll's period: the controller manager makes it
        yield name
    finally:
        kubectl.delete_namespace(name)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (so pods can be created)."""
    with fresh_namespace(kubectl, request.node.nodeid) as name:
        yield name
