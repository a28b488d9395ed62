"""The kind files (e2e/kind) cannot run on this machine, which has no Docker; this holds
what can be checked without it: the scripts parse, the cluster config is the kind config
the scripts expect, and the Dockerfiles build the images the manifests name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "e2e" / "kind"
SCRIPTS = sorted(KIND.glob("*.sh"))

pytestmark = pytest.mark.unit


def test_the_scripts_are_there() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"up.sh", "down.sh", "gpu-node-patch.sh", "build-and-load.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_with_bash_n(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_strict_and_executable(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert script.stat().st_mode & 0o111


def test_cluster_config_has_a_labelled_gpu_worker() -> None:
    config: dict[str, Any] = yaml.safe_load((KIND / "cluster.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [node["role"] for node in config["nodes"]]
    assert roles.count("control-plane") == 1
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert any(n.get("labels", {}).get("modelpool.dev/fake-gpu") == "true" for n in workers)
    assert "modelpool.dev/fake-gpu=true" in (KIND / "gpu-node-patch.sh").read_text()


def test_gpu_patch_advertises_capacity_and_allocatable() -> None:
    text = (KIND / "gpu-node-patch.sh").read_text()
    assert "--subresource=status" in text
    assert "/status/capacity/nvidia.com~1gpu" in text
    assert "/status/allocatable/nvidia.com~1gpu" in text


@pytest.mark.parametrize(
    ("image", "entrypoint"),
    [
        ("reconciler", '["python", "-m", "reconciler"]'),
        ("router", '["python", "-m", "sidecar"]'),
        ("fake-model", '["python", "-m", "e2e.fake_model"]'),
    ],
)
def test_dockerfile_builds_the_program(image: str, entrypoint: str) -> None:
    dockerfile = KIND / f"Dockerfile.{image}"
    text = dockerfile.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert "pip install ." in text
    assert f"ENTRYPOINT {entrypoint}" in text
    assert re.search(r"^USER \d+:\d+$", text, re.MULTILINE)  # numeric, for runAsNonRoot
    # Every COPY source exists relative to the repository root (the build context).
    for line in text.splitlines():
        if line.startswith("COPY "):
            *sources, _dest = line.split()[1:]
            for source in sources:
                assert (ROOT / source).exists(), f"{dockerfile.name}: {source} is missing"
    assert (KIND / f"Dockerfile.{image}.dockerignore").exists()
    build = (KIND / "build-and-load.sh").read_text()
    loop = re.search(r"^for name in (.+); do$", build, re.MULTILINE)
    assert loop is not None and image in loop.group(1).split()
    assert 'Dockerfile.${name}' in build


def test_up_applies_the_kind_overlay() -> None:
    text = (KIND / "up.sh").read_text()
    assert "-k \"$root/overlays/kind\"" in text
    assert (ROOT / "overlays" / "kind" / "kustomization.yaml").exists()
