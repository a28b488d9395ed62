"""The GPU script's llama-server handle (`benchmarks/gpu/server.py`) against a stand-in with
llama-server's start order (tools/server/server.cpp): `/health` turns 200, then the SIGTERM
handler is installed, then the task loop starts, and until it has, a SIGTERM is lost. The
stand-in ignores SIGTERM until its loop starts and answers `GET /slots` only from the loop."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu.server import LlamaServer, ServerError

pytestmark = pytest.mark.functional

STANDIN = '''
import http.server, pathlib, signal, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
loop_started = threading.Event()
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the handler's flag, cleared by the loop start

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slots":
            loop_started.wait()   # a task of the loop: answered once it runs
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"[]")
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
threading.Event().wait(LOOP_DELAY_S)   # between the ready flag and the loop
signal.signal(signal.SIGTERM, signal.SIG_DFL)
pathlib.Path(__file__).with_name("loop-started").write_text(repr(time.monotonic()))
loop_started.set()
threading.Event().wait()
'''


def standin(tmp_path: Path, loop_delay_s: float) -> Path:
    script = tmp_path / "llama-server.py"
    script.write_text(STANDIN.replace("LOOP_DELAY_S", repr(loop_delay_s)))
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    binary.chmod(0o755)
    return binary


def test_ready_waits_for_the_task_loop_so_a_sigterm_at_once_is_not_lost(
        tmp_path: Path) -> None:
    with (tmp_path / "server.log").open("wb") as log:
        server = LlamaServer(standin(tmp_path, 2.0), tmp_path / "m.gguf", 256, [], log, "m")
        try:
            ready_s = server.wait_ready(30)
            returned = time.monotonic()
            exit_s = server.stop(timeout_s=10)
        finally:
            server.process.kill()
            server.process.wait()
    loop_started = float((tmp_path / "loop-started").read_text())  # the same monotonic clock
    assert returned > loop_started, "ready before the task loop ran"
    assert server.started + ready_s < loop_started, "the figure is the first /health 200"
    assert exit_s < 5


def test_a_server_that_never_starts_its_loop_is_not_ready(tmp_path: Path) -> None:
    with (tmp_path / "server.log").open("wb") as log:
        server = LlamaServer(standin(tmp_path, 3600.0), tmp_path / "m.gguf", 256, [], log, "m")
        try:
            with pytest.raises(ServerError, match="not ready in 3 s"):
                server.wait_ready(3)
        finally:
            server.process.kill()
            server.process.wait()
