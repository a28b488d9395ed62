"""Fixtures of the e2e suite: the local cluster's (e2e/local/fixtures.py) plus the system
installed in a pod, scoped to the test's namespace (e2e/harness.py says why scoped).

Tests here are marked `e2e` by directory (mark_by_directory), like tests/integration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e import harness
from e2e.local import fixtures as local

# The local cluster's fixtures, found by name.
cluster = local.cluster
kubeconfig = local.kubeconfig
kubectl = local.kubectl
api = local.api
namespace = local.namespace


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help="how long the soak sends traffic (default: MODELPOOL_SOAK_SECONDS, else short)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    local.mark_by_directory(items)
    soak = config.getoption("--soak-seconds")
    if soak is not None:
        # A long soak outlives the default per-test timeout: give it its length plus set-up.
        for item in items:
            if "soak" in item.nodeid:
                item.add_marker(pytest.mark.timeout(int(soak) + 600), append=False)
    local.check_tiers(items)


@pytest.fixture
def installed(kubectl: local.Kubectl, namespace: str) -> Iterator[harness.Installation]:
    """modelpool installed from overlays/local, its reconciler in a pod watching `namespace`.

    Afterwards the test's pools, servers and routers are deleted and their pods waited
    for, so the node's one GPU is free when the next test starts."""
    installation = harness.install(kubectl, scope=namespace)
    try:
        yield installation
    finally:
        try:
            harness.remove_workloads(kubectl, namespace)
        finally:
            harness.uninstall_scope(kubectl, namespace)
