"""Runs the fake model server as a child process on a free loopback port, for tests that
need a real upstream: the fake server's own tests and the router's functional tests.

    async with run_fake_model("--mode", "llamacpp", log_path=tmp_path / "a.log") as server:
        client = AsyncOpenAI(base_url=server.openai_base_url, api_key="none")

The child inherits this process's environment minus any ``FAKE_MODEL_*``, ``MODELPOOL_*``
and ``NVIDIA_*`` variables (so a developer's shell cannot change a test), plus ``env``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_INTERVAL_SECONDS = 0.05
# Waits give up after this long so a broken server fails a test instead of hanging it;
# wrap a call in asyncio.timeout() for a tighter bound.
WAIT_LIMIT_SECONDS = 30.0
_SCRUBBED_PREFIXES = ("FAKE_MODEL_", "MODELPOOL_", "NVIDIA_")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class FakeModelExitedError(RuntimeError):
    """The server process ended while a caller was waiting for it to serve."""


@dataclass
class FakeModelProcess:
    process: asyncio.subprocess.Process
    host: str
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def health_status(self, session: aiohttp.ClientSession) -> int | None:
        """The HTTP status of ``/health``, or None while nothing answers."""
        try:
            async with session.get(f"{self.base_url}/health") as response:
                return response.status
        except aiohttp.ClientConnectionError:
            return None

    async def wait_for_health(self, wanted: set[int]) -> int:
        """Poll ``/health`` until its status is in ``wanted``; return it."""
        async with asyncio.timeout(WAIT_LIMIT_SECONDS), aiohttp.ClientSession() as session:
            while True:
                if self.process.returncode is not None:
                    raise FakeModelExitedError(
                        f"fake model exited with {self.process.returncode}:\n{self.log()}"
                    )
                status = await self.health_status(session)
                if status in wanted:
                    return status
                await asyncio.sleep(POLL_INTERVAL_SECONDS)

    async def wait_ready(self) -> None:
        await self.wait_for_health({200})

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    async def wait_exit(self) -> int:
        async with asyncio.timeout(WAIT_LIMIT_SECONDS):
            return await self.process.wait()

    async def stop(self, grace_seconds: float = WAIT_LIMIT_SECONDS) -> int:
        """SIGTERM, then SIGKILL if it has not exited within ``grace_seconds``."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_seconds):
                return await self.process.wait()
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()


def child_environment(env: Mapping[str, str] | None, host: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    return {**base, "MODELPOOL_BIND_HOST": host, **(env or {})}


async def start_fake_model(
    *args: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
) -> FakeModelProcess:
    """Start ``python -m e2e.fake_model ARGS --port <free>`` bound to ``host``."""
    port = free_port(host)
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "e2e.fake_model",
            *args,
            "--port",
            str(port),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=child_environment(env, host),
            cwd=REPO_ROOT,
        )
    return FakeModelProcess(process=process, host=host, port=port, log_path=log_path)


@contextlib.asynccontextmanager
async def run_fake_model(
    *args: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    wait_ready: bool = True,
) -> AsyncIterator[FakeModelProcess]:
    """A running fake model server (ready unless ``wait_ready`` is false), stopped on exit."""
    server = await start_fake_model(*args, log_path=log_path, env=env, host=host)
    try:
        if wait_ready:
            await server.wait_ready()
        yield server
    finally:
        await server.stop()
