"""Shared test plumbing: the local-cluster fixtures and the tier markers.

Tests under tests/integration and e2e/tests are marked `integration` and `e2e` when they
carry no tier marker; a test that uses the cluster without one of those markers is a
collection error, so unit and functional runs never start a cluster.
"""

from __future__ import annotations

import pytest

from e2e.local.fixtures import (  # noqa: F401  (fixtures are found by name)
    api,
    check_tiers,
    cluster,
    kubeconfig,
    kubectl,
    mark_by_directory,
    namespace,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_by_directory(items)
    check_tiers(items)
