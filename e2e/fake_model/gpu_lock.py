"""The fake server's hold on its GPU: an exclusive ``flock`` per assigned device, so two
loaded servers on one device fail loudly instead of both pretending to own its VRAM.

The kernel drops a ``flock`` when its last descriptor closes, so a crashed server never
leaves a device locked.
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


def lock_path(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"gpu{device}.lock"


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
