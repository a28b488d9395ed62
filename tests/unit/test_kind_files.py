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


def _pipefail_scripts() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    scripts = []
    for name in tracked:
        path = ROOT / name
        if not path.is_file() or path.suffix not in ("", ".sh"):
            continue
        with path.open("rb") as file:
            head = file.read(4096)
        if head.startswith((b"#!/usr/bin/env bash", b"#!/bin/bash")) and b"pipefail" in head:
            scripts.append(path)
    return scripts


# A reader that stops at its first match closes the pipe while the writer may still have
# lines to write (kind writes one per cluster): the writer dies of SIGPIPE and pipefail turns
# "found" into a failure, once in a while. Such a pipeline reads its input whole instead
# (`sed -n 1p`, or a here-string searched after the command has ended).
STOPS_EARLY = re.compile(r"\|\s*(head\b|grep\s+(-\w*[qm]|--quiet|--max-count))")


def test_no_pipeline_under_pipefail_ends_in_a_reader_that_stops_early() -> None:
    scripts = _pipefail_scripts()
    assert any(p.name == "up.sh" for p in scripts) and any(p.name == "lint" for p in scripts)
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in scripts
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if not line.lstrip().startswith("#") and STOPS_EARLY.search(line)]
    assert not found, "\n".join(found)


def line_of(text: list[str], pattern: str) -> int:
    (index,) = [i for i, line in enumerate(text) if re.match(pattern, line)]
    return index


def test_two_clusters_side_by_side_build_their_images_one_at_a_time() -> None:
    """kind and kind b come up at once (e2e/stages.py); the product's image build rewrites
    dist/wheels in the checkout, so a second build beside it copies half a folder of wheels
    (`No matching distribution found for kr8s`). The builds hold a lock; the loads do not."""
    text = (KIND / "build-and-load.sh").read_text().splitlines()
    taken = line_of(text, r"flock 8$")
    assert taken < line_of(text, r"base=\"\$\(bash") < line_of(text, r"build_product$")
    released = line_of(text, r"flock -u 8$")
    assert line_of(text, r"build_kube_router$") < released < line_of(text, r"load\(\) \{")
    assert line_of(text, r"exec 8>&-$") == released + 1


def test_one_dockerd_starts_when_two_clusters_come_up_at_once() -> None:
    text = (KIND / "docker-engine.sh").read_text().splitlines()
    taken = line_of(text, r"flock 9$")
    assert taken < line_of(text, r"nohup dockerd ")
    # dockerd lives on: the lock's descriptor is not passed to it
    assert "9>&-" in text[line_of(text, r"nohup dockerd ")]
