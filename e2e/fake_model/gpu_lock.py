"""The fake server's hold on its GPU: an exclusive ``flock`` per assigned device, so two
loaded servers on one device fail loudly instead of both pretending to own its VRAM.

The kernel drops a ``flock`` when its last descriptor closes, so a crashed server never
leaves a device locked. ``holders`` tells who holds which device without touching the
locks (it reads /proc/locks), so a test can sample it while servers come and go.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

logger = logging.getLogger(__name__)


class GpuInUseError(RuntimeError):
    def __init__(self, device: str) -> None:
        super().__init__(f"GPU {device} is already in use")
        self.device = device


LOCK_PREFIX, LOCK_SUFFIX = "gpu", ".lock"
PROC_LOCKS = Path("/proc/locks")


def lock_path(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"{LOCK_PREFIX}{device}{LOCK_SUFFIX}"


def parse_proc_locks(text: str) -> dict[tuple[int, int, int], int]:
    """Granted ``flock`` locks in /proc/locks as {(major, minor, inode): pid}; waiters
    (lines with ``->``) are not holders."""
    held: dict[tuple[int, int, int], int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            held[(int(major, 16), int(minor, 16), int(inode))] = int(fields[4])
        except ValueError:
            continue
    return held


def holders(lock_dir: Path, proc_locks: Path = PROC_LOCKS) -> dict[str, int]:
    """{device id: pid} of the GPU locks held right now in ``lock_dir`` (Linux only)."""
    held = parse_proc_locks(proc_locks.read_text())
    found: dict[str, int] = {}
    for path in lock_dir.glob(f"{LOCK_PREFIX}*{LOCK_SUFFIX}"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        pid = held.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
        if pid is not None:
            found[path.name[len(LOCK_PREFIX) : -len(LOCK_SUFFIX)]] = pid
    return found


class GpuLocks:
    """Exclusive locks on ``<dir>/gpu<id>.lock`` for each device, all or none."""

    def __init__(self, lock_dir: Path, devices: Sequence[str]) -> None:
        self._lock_dir = lock_dir
        self._devices = tuple(devices)
        self._fds: list[int] = []

    def acquire(self) -> None:
        """Take every lock without blocking; on a held one release those taken and raise
        GpuInUseError naming the device."""
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        for device in self._devices:
            fd = os.open(lock_path(self._lock_dir, device), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                os.close(fd)
                self.release()
                raise GpuInUseError(device) from e
            self._fds.append(fd)
            # The holder's pid, for a person looking at the lock directory.
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            logger.info("holding GPU %s (%s)", device, lock_path(self._lock_dir, device))

    def release(self) -> None:
        while self._fds:
            fd = self._fds.pop()
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> GpuLocks:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
