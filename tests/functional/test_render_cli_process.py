"""`python -m reconciler render` as a person runs it: a real subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.unit.test_render_cli import EXAMPLES, ROOT, _deployments

pytestmark = pytest.mark.functional


def test_python_dash_m_reconciler_render() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reconciler", "render", "-n", "demo", *map(str, EXAMPLES)],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert _deployments(objects) == {"gemma": 1, "qwen": 0, "chat-router": 1}
    assert "config.json: |" in result.stdout  # the config reads as a block, for review
