"""What `pip install .` installs: the product, and none of the testbeds.

The wheel is built as pip builds it for an install, from a copy of the checkout, and read:
its import packages, its commands, its templates. The developer's editable install, the one
the tests run in, has the testbeds' commands as well (setup.py, build_backend.py).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = {"reconciler", "sidecar", "telemetry", "kubecore", "templates"}
PRODUCT_COMMANDS = {"modelpool-reconciler", "modelpool-router", "modelpool-kv-clean",
                    "modelpool-kv-files"}
TESTBED_COMMANDS = {"modelpool-local", "modelpool-fake-model"}
# What a copy of the checkout leaves out: version control, environments, caches, builds.
NOT_COPIED = (".git", ".venv", "build", "dist", "mutants", "__pycache__", "*.egg-info",
              ".mypy_cache", ".ruff_cache", ".pytest_cache")
IMPORTS_TESTBED = re.compile(r"^\s*(?:from|import)\s+(?:e2e|tests|benchmarks)\b", re.MULTILINE)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    tmp = tmp_path_factory.mktemp("packaging")
    checkout = tmp / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(*NOT_COPIED))
    env = {k: v for k, v in os.environ.items() if k != "MODELPOOL_BUILD_TESTBEDS"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
         "-w", str(tmp / "wheels"), str(checkout)],
        capture_output=True, text=True, timeout=180, check=False, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = (tmp / "wheels").glob("modelpool-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def _top_level(archive: zipfile.ZipFile) -> set[str]:
    names = {name.split("/", 1)[0] for name in archive.namelist()}
    return {name for name in names if not name.endswith(".dist-info")}


def _commands(archive: zipfile.ZipFile) -> set[str]:
    (entry_points,) = (n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
    text = archive.read(entry_points).decode()
    section = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    return {line.split("=", 1)[0].strip() for line in section.splitlines() if "=" in line}


def test_the_wheel_holds_the_product_packages_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    assert _top_level(wheel) == {p for p in PRODUCT_PACKAGES if (ROOT / p).is_dir()}


def test_the_wheel_installs_only_the_product_commands(wheel: zipfile.ZipFile) -> None:
    assert _commands(wheel) == PRODUCT_COMMANDS


def test_the_wheel_holds_every_template(wheel: zipfile.ZipFile) -> None:
    templates = {p.relative_to(ROOT).as_posix() for p in (ROOT / "templates").rglob("*.j2")}
    assert {n for n in wheel.namelist() if n.startswith("templates/")} == templates


def test_nothing_in_the_wheel_imports_a_testbed(wheel: zipfile.ZipFile) -> None:
    importing = [n for n in wheel.namelist()
                 if n.endswith(".py") and IMPORTS_TESTBED.search(wheel.read(n).decode())]
    assert importing == []


def test_the_editable_install_has_the_testbeds_commands_too() -> None:
    commands = {ep.name for ep in importlib.metadata.distribution("modelpool").entry_points
                if ep.group == "console_scripts"}
    assert commands == PRODUCT_COMMANDS | TESTBED_COMMANDS
