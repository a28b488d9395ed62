"""The fake server's share of a device that several servers hold at once: a memory ledger
per device, kept in the same directory as the exclusive locks (``gpu_lock``).

A device with a memory capacity (``MODELPOOL_GPU_MEMORY``, bytes, from the fake device
plugin's shared mode) is charged, not locked: each server that loads on it writes its
footprint into ``<dir>/gpu<id>.charges/<pid>-<token>.charge`` and holds an exclusive
``flock`` on that file while it lives. A load first takes the device's ledger lock
(``<dir>/gpu<id>.ledger``), sums the charges whose holders still live (a charge file whose
lock can be taken is a dead server's: it is removed), and refuses with
``GpuMemoryExhausted`` when its own footprint would pass the capacity, as a real runtime
fails with CUDA out of memory. The kernel drops a dead server's lock, so a crash never
leaves memory charged.

``live_charges`` reads who holds what without touching any lock (it reads /proc/locks, as
``gpu_lock.holders`` does), so a test can sample the ledger while servers come and go.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from e2e.fake_model.gpu_lock import PROC_LOCKS, parse_proc_locks

logger = logging.getLogger("fake_model.gpu_ledger")

CHARGE_SUFFIX = ".charge"


class GpuMemoryExhausted(RuntimeError):
    def __init__(self, device: str, requested: int, charged: int, capacity: int) -> None:
        super().__init__(
            f"GPU {device} out of memory: {requested} bytes requested, {charged} charged by "
            f"the servers on it, capacity {capacity}")
        self.device = device
        self.requested = requested
        self.charged = charged
        self.capacity = capacity


@dataclass(frozen=True)
class Charge:
    pid: int
    bytes: int
    path: Path


def charges_dir(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"gpu{device}.charges"


def ledger_lock(lock_dir: Path, device: str) -> Path:
    return lock_dir / f"gpu{device}.ledger"


def _read_bytes(path: Path) -> int | None:
    try:
        first = path.read_text().split()
    except (FileNotFoundError, PermissionError):
        return None
    try:
        return int(first[0]) if first else None
    except ValueError:
        return None


def live_charges(lock_dir: Path, device: str, proc_locks: Path = PROC_LOCKS) -> list[Charge]:
    """The charges on `device` whose holders live right now (Linux only)."""
    held = parse_proc_locks(proc_locks.read_text())
    found = []
    for path in sorted(charges_dir(lock_dir, device).glob(f"*{CHARGE_SUFFIX}")):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        pid = held.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
        amount = _read_bytes(path)
        if pid is not None and amount is not None:
            found.append(Charge(pid, amount, path))
    return found


class GpuLedger:
    """This server's charge of `footprint` bytes on each device of `devices`, all or none."""

    def __init__(self, lock_dir: Path, devices: tuple[str, ...], footprint: int,
                 capacity: int) -> None:
        self._lock_dir = lock_dir
        self._devices = devices
        self._footprint = footprint
        self._capacity = capacity
        self._held: list[tuple[int, Path]] = []

    def acquire(self) -> None:
        """Charge every device, or none (raising GpuMemoryExhausted for the first that is
        full)."""
        try:
            for device in self._devices:
                self._charge(device)
        except BaseException:
            self.release()
            raise

    def _charge(self, device: str) -> None:
        directory = charges_dir(self._lock_dir, device)
        # Servers of other users share the device: the directory and the ledger lock are
        # open to all (the fake device plugin makes them so; a first server here, too).
        # A lock is taken on a read-only descriptor, so anyone can probe anyone's charge.
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(PermissionError):
                directory.chmod(0o777)
        ledger = os.open(ledger_lock(self._lock_dir, device), os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(ledger, fcntl.LOCK_EX)  # brief: other loads on this device wait
            charged = sum(self._live(path) for path in directory.glob(f"*{CHARGE_SUFFIX}"))
            if charged + self._footprint > self._capacity:
                raise GpuMemoryExhausted(device, self._footprint, charged, self._capacity)
            path = directory / f"{os.getpid()}-{secrets.token_hex(4)}{CHARGE_SUFFIX}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"{self._footprint} {os.getpid()}\n".encode())
            self._held.append((fd, path))
            logger.info("charged GPU %s with %d bytes (%d of %d now)", device,
                        self._footprint, charged + self._footprint, self._capacity)
        finally:
            fcntl.flock(ledger, fcntl.LOCK_UN)
            os.close(ledger)

    @staticmethod
    def _live(path: Path) -> int:
        """The charge's bytes if its holder lives; a dead holder's charge is removed."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_bytes(path) or 0
            path.unlink(missing_ok=True)  # nobody holds it: its server is gone
            return 0
        finally:
            os.close(fd)

    def acquire_for_exec(self) -> list[int]:
        """Charge every device and return the descriptors that hold the charges, for a
        process that passes them on to the program it becomes (exec)."""
        self.acquire()
        return [fd for fd, _ in self._held]

    def release(self) -> None:
        while self._held:
            fd, path = self._held.pop()
            path.unlink(missing_ok=True)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> GpuLedger:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
