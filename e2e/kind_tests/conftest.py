"""The e2e tier on kind: a real kubelet, containerd and CNI running the project's images
(e2e/kind/up.sh). The cluster is the one MODELPOOL_KIND_KUBECONFIG names (scripts/test
brings it up first and sets it); without it, the session brings it up itself.

Every test works in a namespace of its own that enforces Pod Security `restricted`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.local import fixtures as local
from e2e.local.paths import REPO_ROOT

UP = REPO_ROOT / "e2e" / "kind" / "up.sh"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    local.mark_by_directory(items)


@pytest.fixture(scope="session")
def kind_kubeconfig() -> Path:
    configured = os.environ.get("MODELPOOL_KIND_KUBECONFIG")
    if configured:
        return Path(configured)
    result = subprocess.run(["bash", str(UP)], stdout=subprocess.PIPE, text=True,
                            timeout=3600, check=False)
    assert result.returncode == 0, f"{UP} failed (exit {result.returncode})"
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kind_kubectl(kind_kubeconfig: Path) -> local.Kubectl:
    return local.Kubectl(kind_kubeconfig, shutil.which("kubectl") or "kubectl")


@pytest.fixture
def restricted_namespace(request: pytest.FixtureRequest,
                         kind_kubectl: local.Kubectl) -> Iterator[str]:
    name = local._namespace_name(request.node.nodeid)
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                   "pod-security.kubernetes.io/enforce-version": "latest",
                   "modelpool.dev/test": "true"}}}
    kind_kubectl("create", "-f", "-", input=json.dumps(manifest))
    deadline = time.monotonic() + 30
    while kind_kubectl("get", "serviceaccount", "default", "-n", name,
                       check=False).returncode != 0:
        assert time.monotonic() < deadline, "the namespace's default ServiceAccount never came"
        time.sleep(0.2)
    try:
        yield name
    finally:
        kind_kubectl("delete", "namespace", name, "--wait=false", check=False)
