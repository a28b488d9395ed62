"""The e2e tier on kind: a real kubelet, containerd and CNI running the project's images
(e2e/kind/up.sh). The cluster is the one MODELPOOL_KIND_KUBECONFIG names (scripts/test
brings it up first and sets it); without it, the session brings it up itself.

Every test works in a namespace of its own that enforces Pod Security `restricted`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import testbeds
from e2e.local import fixtures as local

DRA_ONLY = ("test_dra_driver.py", "test_claim_pool_dra.py")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The DRA driver's tests and a claim pool's need their own cluster
    (e2e/kind/up-dra.sh): without `MODELPOOL_KIND_DRA=1` they are not collected at all, so
    no run counts them."""
    if collection_path.name in DRA_ONLY and os.environ.get("MODELPOOL_KIND_DRA") != "1":
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    local.mark_by_directory(items)


@pytest.fixture(scope="session")
def kind_kubeconfig() -> Path:
    return testbeds.kind_kubeconfig()


@pytest.fixture(scope="session")
def kind_kubectl(kind_kubeconfig: Path) -> local.Kubectl:
    return local.Kubectl(kind_kubeconfig, shutil.which("kubectl") or "kubectl")


@pytest.fixture
def restricted_namespace(request: pytest.FixtureRequest,
                         kind_kubectl: local.Kubectl) -> Iterator[str]:
    with local.fresh_namespace(kind_kubectl, request.node.nodeid, "restricted") as name:
        yield name
