"""The testbed's git server (e2e/flux/git_server.py) judged by git itself: a clone of the
empty repository, a push large enough that git sends it chunked, and a clone that gets
back exactly what was pushed; Flux's source-controller fetches from it on kind
(e2e/kind_tests/test_flux.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid",
           "GIT_TERMINAL_PROMPT": "0"}

pytestmark = pytest.mark.functional


def git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "e2e.flux.git_server", "--root", str(tmp_path / "srv"),
         "--repo", "modelpool", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20.0
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                assert process.poll() is None, (tmp_path / "server.log").read_text()
                assert time.monotonic() < deadline, "the git server never answered /healthz"
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(0.05)  # returns at once should it exit
        yield f"{base}/modelpool.git"
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def test_a_chunked_push_is_cloned_back_exactly(server: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    git("clone", "-q", server, str(work))
    assert git("symbolic-ref", "HEAD", cwd=work) == "refs/heads/main"
    (work / "big").write_bytes(os.urandom(3 * 1024 * 1024))
    (work / "README").write_text("the pool\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    # a post buffer smaller than the pack: git sends the push with chunked encoding
    git("-c", "http.postBuffer=65536", "push", "-q", "origin", "HEAD:main", cwd=work)
    pushed = git("rev-parse", "HEAD", cwd=work)

    again = tmp_path / "again"
    git("clone", "-q", server, str(again))
    assert git("rev-parse", "HEAD", cwd=again) == pushed
    assert (again / "big").read_bytes() == (work / "big").read_bytes()
    assert git("ls-remote", server, "refs/heads/main").split()[0] == pushed


def test_an_unknown_repository_is_a_404(server: str) -> None:
    url = server.replace("modelpool.git", "nothing.git") + "/info/refs?service=git-upload-pack"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    refused.value.close()  # an HTTPError holds the connection's socket
    assert refused.value.code == 404
