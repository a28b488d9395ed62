"""The hosted CI's workflows run what a person runs: scripts/images and
scripts/release-manifest for a release, scripts/test for a pull request. (actionlint, in
scripts/lint, checks that they are valid workflows.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _workflow(name: str) -> dict[Any, Any]:
    loaded = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def _runs(workflow: dict[Any, Any]) -> list[str]:
    return [step["run"] for job in workflow["jobs"].values() for step in job["steps"]
            if "run" in step]


def test_a_version_tag_releases_through_the_scripts() -> None:
    release = _workflow("release.yml")
    # PyYAML reads the key `on` as True.
    assert release[True] == {"push": {"tags": ["v*"]}}
    runs = "\n".join(_runs(release))
    assert 'scripts/images --push "ghcr.io/${GITHUB_REPOSITORY_OWNER,,}"' in runs
    assert "--platform linux/amd64,linux/arm64" in runs
    assert "scripts/release-manifest" in runs
    assert "dist/install.yaml" in runs
    uses = [step.get("uses", "") for job in release["jobs"].values() for step in job["steps"]]
    assert any(u.startswith("docker/setup-buildx-action@") for u in uses)
    assert release["permissions"] == {"contents": "write", "packages": "write"}


def test_a_pull_request_runs_the_test_command() -> None:
    test = _workflow("test.yml")
    assert "pull_request" in test[True]
    assert "scripts/test" in _runs(test)


def test_lint_checks_the_workflows() -> None:
    assert "actionlint" in (ROOT / "scripts" / "lint").read_text()
