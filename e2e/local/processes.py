"""Detached processes tracked by pid files.

A component must outlive the `modelpool-local up` that started it, and a later `down`
from another process must find it. So each one runs in its own session (it is not our
child: `setsid --fork`), writes its pid itself before it execs (`sh -c 'echo $$ >pid;
exec ...'`), and is recognised later by its pid *and* its whole command line (which
names its cluster's state directory), so a recycled pid, even one now running the same
binary for another cluster, is never mistaken for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_LAUNCH = 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"'


@dataclass(frozen=True)
class Tracked:
    """A pid file's content and the command line the process was started with."""

    pid: int
    argv: tuple[str, ...]


def _argv_file(pid_file: Path) -> Path:
    return pid_file.with_suffix(".argv")


def _read(pid_file: Path) -> Tracked | None:
    try:
        pid = int(pid_file.read_text().strip())
        argv = tuple(_argv_file(pid_file).read_text().split("\0"))
        return Tracked(pid, argv)
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> tuple[str, ...] | None:
    """The live command line of `pid`; None when it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                return None
    except OSError:
        return None
    if not raw:
        return None
    return tuple(raw.rstrip(b"\0").decode(errors="replace").split("\0"))


def running(pid_file: Path) -> int | None:
    """The pid of the live process that `pid_file` tracks, else None."""
    tracked = _read(pid_file)
    if tracked is None:
        return _running_by_executable(pid_file)
    return tracked.pid if _cmdline(tracked.pid) == tracked.argv else None


def _running_by_executable(pid_file: Path) -> int | None:
    """Pid files of the first testbed builds recorded only the executable (`.exe`)."""
    try:
        pid = int(pid_file.read_text().strip())
        executable = pid_file.with_suffix(".exe").read_text().strip()
    except (OSError, ValueError):
        return None
    cmdline = _cmdline(pid)
    return pid if cmdline is not None and cmdline[0] == executable else None


def start(
    argv: Sequence[str],
    pid_file: Path,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 10.0,
) -> int:
    """Start `argv` detached, its output appended to `log_file`; return its pid."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.unlink(missing_ok=True)
    _argv_file(pid_file).write_text("\0".join(argv))
    with log_file.open("ab") as out:
        launcher = subprocess.run(
            ["setsid", "--fork", "sh", "-c", _LAUNCH, str(pid_file), *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            check=False,
        )
    if launcher.returncode != 0:
        raise RuntimeError(f"could not launch {argv[0]} (see {log_file})")
    # The pid file appears just before the exec: wait until the pid runs `argv`.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = running(pid_file)
        if pid is not None:
            return pid
        tracked = _read(pid_file)
        if tracked is not None and not Path(f"/proc/{tracked.pid}").exists():
            raise RuntimeError(f"{argv[0]} exited at once (see {log_file})")
        time.sleep(0.01)
    raise RuntimeError(f"{argv[0]} did not start within {timeout}s (see {log_file})")


def _alive(pid: int) -> bool:
    return _cmdline(pid) is not None


def _signal(pid: int, sig: signal.Signals, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def stop(pid_file: Path, grace: float) -> bool:
    """SIGTERM the tracked process, SIGKILL its session's group after `grace` seconds.

    Returns whether a process was running. The pid file is removed either way.
    """
    pid = running(pid_file)
    if pid is not None:
        _signal(pid, signal.SIGTERM, group=False)
        if not _wait_gone(pid, grace):
            log.warning("%s ignored SIGTERM for %.0fs; killing it", pid_file.stem, grace)
        # The launcher made the process a session and group leader: its group holds
        # whatever it started and did not move elsewhere.
        _signal(pid, signal.SIGKILL, group=True)
        _wait_gone(pid, 5.0)
    pid_file.unlink(missing_ok=True)
    _argv_file(pid_file).unlink(missing_ok=True)
    pid_file.with_suffix(".exe").unlink(missing_ok=True)
    return pid is not None


def _ancestors() -> set[int]:
    """This process and its parents: never killed, whatever their command line says."""
    pids = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def kill_under(directory: Path) -> list[int]:
    """SIGKILL every process whose working directory or command line lies in `directory`.

    The last resort of `down`: pods that a dead node agent left behind still run in
    the state directory, and nothing else of ours does.
    """
    root = str(directory.resolve())
    if root == "/":
        raise ValueError("refusing to sweep processes under /")
    spare = _ancestors()
    killed: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in spare:
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        inside = cwd == root or cwd.startswith(root + "/")
        if inside or any(root + "/" in arg for arg in argv):
            log.warning("killing leftover process %s: %s", proc.name, " ".join(argv)[:200])
            _signal(int(proc.name), signal.SIGKILL, group=False)
            killed.append(int(proc.name))
    return killed
