"""One llama-server process as modelpool runs one: started on a model, ready at its first
`/health` 200, asked over HTTP, stopped with SIGTERM and waited for."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

POLL_S = 0.02  # polling a server's start or a card's memory: there is no event to wait on


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerError(RuntimeError):
    pass


class LlamaServer:
    """`binary --model MODEL -c CONTEXT ARGS` on a loopback port, its output in `log`;
    `label` names it in the figures."""

    def __init__(self, binary: Path, model: Path, context: int, args: Sequence[str],
                 log: BinaryIO, label: str) -> None:
        self.model, self.context, self.label = model, context, label
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port",
             str(self.port), "-c", str(context), *args],
            stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from the start to the first `/health` 200; returns once the server's task
        loop answers too (`GET /slots`, a task of that loop), untimed. llama-server turns
        `/health` to 200, then installs its SIGTERM handler, then starts its task loop; the
        handler stops the loop by clearing a flag that the loop's start sets again, so a
        SIGTERM that lands between the two is lost and the server runs on. A server stopped
        at once after its first 200 (a load or swap step's incumbent) needs its loop begun."""
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"llama-server on {self.label} exited "
                                  f"{self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        ready_s = time.monotonic() - self.started
                        self.wait_task_loop(deadline)
                        return ready_s
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(POLL_S)
        raise ServerError(f"llama-server on {self.label} not ready in {timeout_s} s")

    def wait_task_loop(self, deadline: float) -> None:
        """`GET /slots` answered: the request waits in the task queue until the loop runs."""
        timeout = max(deadline - time.monotonic(), 1.0)
        try:
            with urllib.request.urlopen(self.url + "/slots", timeout=timeout) as reply:
                reply.read()
        except urllib.error.HTTPError as error:
            raise ServerError(f"llama-server on {self.label}: GET /slots answered "
                              f"{error.code} after /health 200") from error

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 300) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                answer: dict[str, Any] = json.loads(reply.read())
                return answer
        except urllib.error.HTTPError as error:
            raise ServerError(f"POST {path}: {error.code} {error.read()[:500]!r}") from error

    def complete(self, prompt: list[int] | str, n_predict: int) -> dict[str, Any]:
        """One `/completion` in slot 0, its prompt kept in the slot's cache."""
        return self.post("/completion", {"prompt": prompt, "n_predict": n_predict,
                                         "id_slot": 0, "cache_prompt": True})

    def stop(self, timeout_s: float = 60) -> float:
        """SIGTERM, as the kubelet sends it; seconds until the process has exited."""
        start = time.monotonic()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise ServerError(f"llama-server on {self.label} ignored SIGTERM "
                                  f"for {timeout_s} s") from None
        return time.monotonic() - start
