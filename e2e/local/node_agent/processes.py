"""Starting and stopping a container's process.

Each process leads its own process group, so a signal reaches whatever it spawned, and
writes stdout and stderr to the container's log file (appended across restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path


class Process:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    def signal_group(self, signum: int) -> None:
        if self._proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signum)

    async def stop(self, grace: float) -> int:
        """SIGTERM the group, SIGKILL it once `grace` seconds have passed."""
        self.signal_group(signal.SIGTERM)
        try:
            async with asyncio.timeout(max(grace, 0.0)):
                return await self._proc.wait()
        except TimeoutError:
            self.signal_group(signal.SIGKILL)
            return await self._proc.wait()


async def start(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_file: Path
) -> Process:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    return Process(proc)


def exit_reason(code: int) -> tuple[int, str, int | None]:
    """(exit code as Kubernetes shows it, reason, signal): a signal death is 128+n."""
    if code < 0:
        return 128 - code, "Error", -code
    return code, "Completed" if code == 0 else "Error", None


def log_tail(log_file: Path, limit: int = 2048, lines: int = 80) -> str:
    """The end of a container's log, as the kubelet reports it for
    `terminationMessagePolicy: FallbackToLogsOnError`."""
    try:
        with log_file.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
