"""scripts/release-manifest: the base as one file, the product's image pinned by digest.

Given the digests scripts/images --push records, every image of the product in the output
is the pushed one by digest (the reconciler's and the one it hands its routers), and the
rest is the base exactly as `kubectl kustomize .` prints it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.spec import DEFAULT_ROUTER_IMAGE
from tests.unit.test_manifests import ROOT

pytestmark = pytest.mark.functional

KUBECTL = shutil.which("kubectl")
SCRIPT = ROOT / "scripts" / "release-manifest"
BASE_REPO = DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[0]
DIGEST = "sha256:" + "4f" * 32


def _run(tmp_path: Path, lines: str) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None, "kubectl is needed to build the kustomizations"
    images = tmp_path / "images.txt"
    images.write_text(lines)
    return subprocess.run(
        [str(SCRIPT), "--images", str(images), "--out", str(tmp_path / "install.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _replace(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, old, new) for v in value]
    return new if value == old else value


def _base() -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(ROOT)], capture_output=True, text=True,
                         timeout=60, check=True)
    return _docs(out.stdout)


@pytest.mark.parametrize(
    "pushed", ["localhost:5000/modelpool", BASE_REPO], ids=["elsewhere", "the-base-registry"])
def test_every_product_image_is_pinned_and_nothing_else_changes(
    tmp_path: Path, pushed: str
) -> None:
    result = _run(tmp_path, f"# pushed by scripts/images\n{BASE_REPO}={pushed}@{DIGEST}\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "install.yaml")
    installed = _docs((tmp_path / "install.yaml").read_text())
    pinned = f"{pushed}@{DIGEST}"
    assert installed == _replace(_base(), DEFAULT_ROUTER_IMAGE, pinned)
    (deploy,) = [o for o in installed if o["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == env["MODELPOOL_ROUTER_IMAGE"] == pinned


@pytest.mark.parametrize(
    "lines",
    [
        "",  # pins nothing
        f"{BASE_REPO}=localhost:5000/modelpool:0.1.0\n",  # a tag, not a digest
        f"{BASE_REPO}=localhost:5000/modelpool@sha256:abc\n",  # not a digest
        f"{BASE_REPO} localhost:5000/modelpool@{DIGEST}\n",
    ],
    ids=["empty", "tag", "short-digest", "no-equals"],
)
def test_a_map_that_pins_nothing_fails(tmp_path: Path, lines: str) -> None:
    result = _run(tmp_path, lines)
    assert result.returncode != 0
    assert not (tmp_path / "install.yaml").exists()


def test_a_name_the_base_lacks_fails(tmp_path: Path) -> None:
    result = _run(tmp_path, f"example.org/other/modelpool=localhost:5000/modelpool@{DIGEST}\n")
    assert result.returncode != 0
    assert "pins no image of the base" in result.stderr
    assert not (tmp_path / "install.yaml").exists()
