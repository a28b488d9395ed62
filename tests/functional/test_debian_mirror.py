"""e2e/kind/debian-mirror.sh: the Debian archive the kind node's root is built from is the
one apt on the machine is configured with, read through `apt-get indextargets`; a stand-in
apt-get on PATH prints what a machine's apt would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "kind" / "debian-mirror.sh"

# `$(IDENTIFIER) $(COMPONENT) $(RELEASE) $(REPO_URI) $(ORIGIN)`, one line per index.
BEHIND_A_MIRROR = """\
Packages main nodistro https://deb.nodesource.com/node_20.x/ Node Source
Packages main bookworm-security http://mirror.corp.example/debian-security/ Debian
Packages main bookworm http://mirror.corp.example/debian/ Debian
DEP-11 main bookworm http://mirror.corp.example/debian/ Debian
Packages main bookworm-updates http://mirror.corp.example/debian/ Debian
"""
ANOTHER_RELEASE = """\
Packages main trixie-security http://security.corp.example/debian-security/ Debian
Packages main trixie http://mirror.corp.example/debian/ Debian
"""
NOT_DEBIAN = """\
Packages main noble http://archive.ubuntu.com/ubuntu/ Ubuntu
Packages main noble-updates http://archive.ubuntu.com/ubuntu/ Ubuntu
"""


def _run(tmp_path: Path, targets: str, *args: str,
         mirror: str | None = None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "targets").write_text(targets)
    apt_get = bin_dir / "apt-get"
    apt_get.write_text(f'#!/bin/sh\n[ "$1" = indextargets ] && exec cat {tmp_path / "targets"}\n'
                       "exit 100\n")
    apt_get.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "MODELPOOL_DEBIAN_MIRROR"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    if mirror is not None:
        env["MODELPOOL_DEBIAN_MIRROR"] = mirror
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=30, check=False)


def test_the_archive_apt_fetches_bookworm_main_from(tmp_path: Path) -> None:
    result = _run(tmp_path, BEHIND_A_MIRROR)
    assert (result.returncode, result.stdout) == (0, "http://mirror.corp.example/debian\n")


def test_an_archive_of_another_debian_release_serves_bookworm_too(tmp_path: Path) -> None:
    result = _run(tmp_path, ANOTHER_RELEASE, "bookworm")
    assert (result.returncode, result.stdout) == (0, "http://mirror.corp.example/debian\n")


def test_no_debian_archive_is_an_error_that_names_the_variable(tmp_path: Path) -> None:
    result = _run(tmp_path, NOT_DEBIAN)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "MODELPOOL_DEBIAN_MIRROR" in result.stderr


def test_the_variable_wins(tmp_path: Path) -> None:
    result = _run(tmp_path, BEHIND_A_MIRROR, mirror="http://other.example/debian")
    assert (result.returncode, result.stdout) == (0, "http://other.example/debian\n")
