"""The kind and Flux scripts (e2e/kind, e2e/flux), checked where no cluster is needed: they
parse and are strict. What they build and run is judged by kind itself (e2e/tests on kind)
and by Flux (e2e/kind_tests/test_flux.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "e2e" / "kind"
SCRIPTS = sorted([*KIND.glob("*.sh"), *(ROOT / "e2e" / "flux").glob("*.sh"),
                  KIND / "node" / "modelpool-entrypoint", KIND / "unprivileged" / "docker"])

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_with_bash_n(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_strict_and_executable(script: Path) -> None:
    text = script.read_text()
    assert text.startswith(("#!/usr/bin/env bash\n", "#!/bin/bash\n"))
    assert "set -euo pipefail" in text
    assert script.stat().st_mode & 0o111


def test_images_run_as_a_numeric_user() -> None:
    """runAsNonRoot can only be verified by the kubelet for a numeric user."""
    text = (KIND / "Dockerfile.python").read_text()
    assert re.search(r"^USER \d+:\d+$", text, re.MULTILINE)


def test_up_applies_the_kind_overlay() -> None:
    text = (KIND / "up.sh").read_text()
    assert "-k \"$root/overlays/kind\"" in text
    assert (ROOT / "overlays" / "kind" / "kustomization.yaml").exists()
