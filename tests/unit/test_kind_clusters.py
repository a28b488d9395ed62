"""e2e/testbeds.py: which kind cluster a process tests on when the kind lane has two."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import testbeds

pytestmark = pytest.mark.unit


def kubeconfig(directory: Path, cluster: str) -> Path:
    path = directory / f"{cluster}.kubeconfig"
    path.write_text(f"apiVersion: v1\nkind: Config\ncurrent-context: kind-{cluster}\n")
    return path


@pytest.mark.parametrize(("worker", "name"), [
    (None, "modelpool"), ("gw0", "modelpool"), ("gw1", "modelpool-b"), ("gw2", "modelpool"),
])
def test_each_worker_takes_the_cluster_of_its_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: str | None,
        name: str) -> None:
    first, second = kubeconfig(tmp_path, "modelpool"), kubeconfig(tmp_path, "modelpool-b")
    monkeypatch.setenv("MODELPOOL_KIND_KUBECONFIG", f"{first}:{second}")
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert testbeds.kind_kubeconfig() == tmp_path / f"{name}.kubeconfig"
    assert testbeds.kind_cluster() == name


def test_one_cluster_serves_every_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only = kubeconfig(tmp_path, "mine")
    monkeypatch.setenv("MODELPOOL_KIND_KUBECONFIG", str(only))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert testbeds.kind_kubeconfig() == only
    assert testbeds.kind_cluster() == "mine"


def test_without_a_kubeconfig_the_cluster_is_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODELPOOL_KIND_KUBECONFIG", raising=False)
    assert testbeds.kind_cluster() == "modelpool"
    monkeypatch.setenv("MODELPOOL_KIND_KUBECONFIG", str(tmp_path / "not-yet-written"))
    assert testbeds.kind_cluster() == "modelpool"
