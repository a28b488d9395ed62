"""scripts/prove-k8s-version, in its dry run: which release it proves and what it runs.

The script runs in a copy of what it reads (itself and docs/install.md), with a stand-in
for `go` that answers the module proxy's list of k8s.io/kubernetes versions, so the choice
of release is checked here without the proxy; the build and the tests themselves are the
script's real run, by hand.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_manifests import ROOT

pytestmark = pytest.mark.functional

SCRIPT = ROOT / "scripts" / "prove-k8s-version"
# What the proxy lists, out of order, with another minor's patches, a pre-release and a
# two-digit patch that sorts before v1.29.9 as text.
VERSIONS = "v1.29.9 v1.28.15 v1.29.10 v1.30.0 v1.29.11-rc.0 v1.29.2"
FAKE_GO = """#!/usr/bin/env bash
echo "$*" >> "$GO_LOG"
[[ "$*" == "list -m -versions k8s.io/kubernetes" ]] || exit 1
echo "k8s.io/kubernetes $GO_VERSIONS"
"""


def _checkout(tmp_path: Path, install_md: str | None = None) -> Path:
    repo = tmp_path / "checkout"
    (repo / "scripts").mkdir(parents=True)
    (repo / "docs").mkdir()
    shutil.copy(SCRIPT, repo / "scripts" / SCRIPT.name)
    docs = repo / "docs" / "install.md"
    if install_md is None:
        shutil.copy(ROOT / "docs" / "install.md", docs)
    else:
        docs.write_text(install_md)
    return repo


def _run(tmp_path: Path, repo: Path, *args: str,
         versions: str = VERSIONS) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "GO_LOG": str(tmp_path / "go.log"), "GO_VERSIONS": versions}
    return subprocess.run([str(repo / "scripts" / SCRIPT.name), "--dry-run", *args],
                          capture_output=True, text=True, timeout=30, check=False, env=env,
                          cwd=tmp_path)


def _plan(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def _stated_minor() -> str:
    match = re.search(r"^### The oldest Kubernetes version: (1\.\d+)$",
                      (ROOT / "docs" / "install.md").read_text(), re.MULTILINE)
    assert match, "docs/install.md states no oldest Kubernetes version"
    return match.group(1)


def test_by_default_it_proves_the_newest_patch_of_the_oldest_version_install_md_states(
    tmp_path: Path,
) -> None:
    minor = _stated_minor()
    assert f"Kubernetes **{minor} or newer**" in (ROOT / "docs" / "install.md").read_text()
    versions = f"v{minor}.9 v{minor}.10 v{minor}.11-rc.0 v{minor}.2 v1.99.0 v{minor}0.1"
    plan = _plan(_run(tmp_path, _checkout(tmp_path), versions=versions))
    assert plan["version"] == f"v{minor}.10"
    assert plan["build"] == f"MODELPOOL_K8S_VERSION=v{minor}.10 e2e/build-control-plane.sh"


def test_the_stated_version_is_read_from_the_heading(tmp_path: Path) -> None:
    repo = _checkout(tmp_path, "# Install\n\n### The oldest Kubernetes version: 1.28\n")
    assert _plan(_run(tmp_path, repo))["version"] == "v1.28.15"


@pytest.mark.parametrize("install_md", [
    "# Install\n\nKubernetes 1.29 or newer.\n",
    "### The oldest Kubernetes version: 1.29\n### The oldest Kubernetes version: 1.30\n",
])
def test_without_one_stated_version_it_refuses(tmp_path: Path, install_md: str) -> None:
    result = _run(tmp_path, _checkout(tmp_path, install_md))
    assert result.returncode == 2
    assert "states no single" in result.stderr


def test_a_minor_takes_its_newest_patch_and_a_patch_is_taken_as_is(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    assert _plan(_run(tmp_path, repo, "1.29"))["version"] == "v1.29.10"
    (tmp_path / "go.log").unlink()
    assert _plan(_run(tmp_path, repo, "v1.30.2"))["version"] == "v1.30.2"
    assert not (tmp_path / "go.log").exists()


@pytest.mark.parametrize("args", [("1.x",), ("v2.0",), ("1.29", "1.30"), ("--fast",)])
def test_it_refuses_what_is_not_one_release(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = _run(tmp_path, _checkout(tmp_path), *args)
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""


def test_a_minor_the_proxy_does_not_serve_is_refused(tmp_path: Path) -> None:
    result = _run(tmp_path, _checkout(tmp_path), "1.27")
    assert result.returncode == 2
    assert "serves no k8s.io/kubernetes v1.27.Z" in result.stderr


def test_it_runs_the_integration_modules_on_a_fresh_cluster_of_that_release(
    tmp_path: Path,
) -> None:
    plan = _plan(_run(tmp_path, _checkout(tmp_path), "v1.29.6"))
    env, pytest_args = plan["tests"].split(" -m pytest ")
    assert env.split() == ["env", "-u", "MODELPOOL_REUSE_CLUSTER", "-u", "MODELPOOL_STATE_DIR",
                           "MODELPOOL_K8S_VERSION=v1.29.6", "python3"]
    modules = pytest_args.split(" --deselect ")[0].split()[1:]
    assert {"tests/integration/test_admission.py",
            "tests/integration/test_reconciler.py"} <= set(modules)
    assert all((ROOT / module).is_file() for module in modules)


def test_arguments_after_a_double_dash_go_to_pytest_in_place_of_the_modules(
    tmp_path: Path,
) -> None:
    plan = _plan(_run(tmp_path, _checkout(tmp_path), "v1.29.6", "--", "-x", "-k", "pool"))
    assert plan["tests"].endswith(" -m pytest -x -k pool")


def test_before_1_30_the_tests_that_need_an_admission_policy_are_left_out(
    tmp_path: Path,
) -> None:
    repo = _checkout(tmp_path)
    older = _plan(_run(tmp_path, repo, "v1.29.6"))["tests"].split()
    left_out = [older[i + 1] for i, arg in enumerate(older) if arg == "--deselect"]
    assert len(left_out) == 2
    for node in left_out:
        module, name = node.split("::")
        assert f"def {name}(" in (ROOT / module).read_text()
        assert "ValidatingAdmissionPolicy" in (ROOT / module).read_text()
    assert "--deselect" not in _plan(_run(tmp_path, repo, "v1.30.2"))["tests"]
