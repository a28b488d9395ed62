"""scripts/images, against a stand-in for docker that records what it is asked.

The script runs in a copy of what it reads (pyproject.toml, the base's Deployment, itself)
made a git repository, so its tags, build arguments, pushes and the digest file it writes
can be checked here, where no registry runs; the real build is scripts/images itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from reconciler.spec import DEFAULT_ROUTER_IMAGE
from tests.unit.test_manifests import ROOT

pytestmark = pytest.mark.functional

DIGEST = "sha256:" + "5e" * 32
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# docker without buildx: `build` and `push` are logged; `image inspect` answers the digest
# of what was pushed, as the engine's RepoDigests would.
FAKE_DOCKER = f"""#!/usr/bin/env bash
echo "$*" >> "$DOCKER_LOG"
case "$1" in
  buildx) exit 1 ;;
  image) printf 'other.example/x@sha256:{"0" * 64}\\n%s@{DIGEST}\\n' "$PUSHED_REPO" ;;
esac
"""


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    (repo / "scripts").mkdir(parents=True)
    (repo / "manifests").mkdir()
    shutil.copy(ROOT / "scripts" / "images", repo / "scripts" / "images")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    shutil.copy(ROOT / "manifests" / "deployment.yaml", repo / "manifests" / "deployment.yaml")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    return repo


def _run(
    tmp_path: Path, repo: Path, *args: str, pushed: str = ""
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "DOCKER_LOG": str(tmp_path / "docker.log"), "PUSHED_REPO": pushed}
    env.pop("MODELPOOL_PYTHON_BASE", None)
    return subprocess.run([str(repo / "scripts" / "images"), *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env, cwd=tmp_path)


def _revision(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_local_build_takes_the_bases_name_the_version_and_the_revision(
    tmp_path: Path,
) -> None:
    repo = _checkout(tmp_path)
    result = _run(tmp_path, repo, "--base", "local/python:3.11")
    assert result.returncode == 0, result.stderr
    revision = _revision(repo)
    base_repo = DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[0]
    assert result.stdout.split() == [f"{base_repo}:{VERSION}", f"{base_repo}:{revision[:12]}"]
    (build,) = [line for line in (tmp_path / "docker.log").read_text().splitlines()
                if line.startswith("build ")]
    for arg in (f"VERSION={VERSION}", f"REVISION={revision}", "BASE=local/python:3.11",
                f"-t {base_repo}:{VERSION}", f"-t {base_repo}:{revision[:12]}", "-f Dockerfile"):
        assert arg in build
    assert not (repo / "dist" / "images.txt").exists()


def test_push_tags_for_the_registry_pushes_both_and_records_the_digest(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    result = _run(tmp_path, repo, "--push", "localhost:5000/", pushed="localhost:5000/modelpool")
    assert result.returncode == 0, result.stderr
    revision = _revision(repo)[:12]
    log = (tmp_path / "docker.log").read_text().splitlines()
    assert f"push -q localhost:5000/modelpool:{VERSION}" in log
    assert f"push -q localhost:5000/modelpool:{revision}" in log
    base_repo = DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[0]
    assert (repo / "dist" / "images.txt").read_text() == (
        f"{base_repo}=localhost:5000/modelpool@{DIGEST}\n")


def test_record_puts_the_digest_where_it_is_told(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    record = tmp_path / "elsewhere" / "pushed.txt"
    result = _run(tmp_path, repo, "--push", "localhost:5000", "--record", str(record),
                  pushed="localhost:5000/modelpool")
    assert result.returncode == 0, result.stderr
    assert record.read_text().endswith(f"=localhost:5000/modelpool@{DIGEST}\n")
    assert not (repo / "dist" / "images.txt").exists()


def test_a_changed_checkout_says_so_in_its_revision(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    with (repo / "pyproject.toml").open("a") as f:
        f.write("\n")
    result = _run(tmp_path, repo)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1].endswith("-dirty")


def test_the_context_revision_is_the_last_commit_that_changed_what_the_image_holds(
    tmp_path: Path,
) -> None:
    repo = _checkout(tmp_path)
    shutil.copy(ROOT / ".dockerignore", repo / ".dockerignore")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]

    def commit(path: str) -> str:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        with (repo / path).open("a") as f:
            f.write("# changed\n")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", path], check=True)
        return _revision(repo)

    def built() -> str:
        result = _run(tmp_path, repo, "--context-revision")
        assert result.returncode == 0, result.stderr
        return result.stdout.split()[1]

    product = commit("reconciler/swap.py")
    for outside in ("tests/unit/test_x.py", "docs/a.md", "e2e/stages.py", "scripts/images"):
        commit(outside)
        assert built() == f"{DEFAULT_ROUTER_IMAGE.rsplit(':', 1)[0]}:{product[:12]}", outside
    assert built().endswith(_revision(repo)[:12]) is False
    inside = commit("pyproject.toml")
    assert built().endswith(inside[:12])
    # without the option, HEAD as before
    assert _run(tmp_path, repo).stdout.split()[1].endswith(_revision(repo)[:12])
    with (repo / "e2e" / "stages.py").open("a") as f:  # a change outside: not dirty
        f.write("#\n")
    assert not built().endswith("-dirty")
    with (repo / "reconciler" / "swap.py").open("a") as f:
        f.write("#\n")
    assert built().endswith(f"{inside[:12]}-dirty")


def test_several_platforms_need_buildx(tmp_path: Path) -> None:
    result = _run(tmp_path, _checkout(tmp_path), "--platform", "linux/amd64,linux/arm64")
    assert result.returncode != 0
    assert "buildx" in result.stderr


# python3 whose pip only writes a wheel per requirement and logs the call; the rest is the
# real interpreter (the script reads pyproject.toml with it).
FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$1 $2" == "-m pip" ]]; then
  echo "$*" >> "$PIP_LOG"
  dir=""; prev=""
  for a in "$@"; do
    [[ $prev == --wheel-dir || $prev == --dest ]] && dir="$a"
    prev="$a"
  done
  touch "$dir/dep-$RANDOM-py3-none-any.whl"
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


def test_host_wheels_are_built_once_and_a_clean_clone_reuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--host-wheels` keeps the dependencies' wheels outside the checkout, keyed by the
    dependency list: a second clean checkout copies them into its build without pip."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    monkeypatch.setenv("REAL_PYTHON", shutil.which("python3") or "python3")
    monkeypatch.setenv("PIP_LOG", str(tmp_path / "pip.log"))
    monkeypatch.setenv("MODELPOOL_CACHE", str(tmp_path / "cache"))
    for clone in ("one", "two"):
        repo = _checkout(tmp_path / clone)
        result = _run(tmp_path, repo, "--host-wheels")
        assert result.returncode == 0, result.stderr
        wheels = sorted(p.name for p in (repo / "dist" / "wheels").glob("*.whl"))
        assert len(wheels) == 2, wheels  # the dependencies', and setuptools' for the build
    pip_calls = (tmp_path / "pip.log").read_text().splitlines()
    assert [c.split()[2] for c in pip_calls] == ["wheel", "download"]  # the first clone's
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all(d in pip_calls[0] for d in deps)
    build = [line for line in (tmp_path / "docker.log").read_text().splitlines()
             if line.startswith("build ")][-1]
    assert "PIP_OPTIONS=--no-index --find-links /src/dist/wheels" in build
