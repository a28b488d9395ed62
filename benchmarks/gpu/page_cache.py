"""A model file's pages out of the page cache, for a load from a cold cache, how much of the
file the cache holds (`fincore`, util-linux), and the file read back into it.

The file's own pages are dropped with `posix_fadvise(DONTNEED)` after an `fsync` (dirty
pages stay otherwise); it needs no privilege and leaves other files alone. With `drop_all`
and as root, `/proc/sys/vm/drop_caches` drops every clean page as well, as the issue's
"page cache dropped" asks on a machine of one's own. The method used is returned, so the
figures say how cold "cold" was.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def evict(path: Path, drop_all: bool) -> str:
    """Drop `path`'s pages (and every clean page with `drop_all`, where allowed); returns
    what was done."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if not drop_all:
        return "fadvise"
    if os.geteuid() != 0:
        return "fadvise (drop_caches needs root)"
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as error:
        return f"fadvise (drop_caches refused: {error.strerror})"
    return "fadvise+drop_caches"


def cached_fraction(path: Path) -> float | None:
    """The share of `path` in the page cache, None where `fincore` is missing or fails."""
    if shutil.which("fincore") is None:
        return None
    result = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                             str(path)], capture_output=True, text=True, check=False,
                            timeout=30)
    size = path.stat().st_size
    if result.returncode != 0 or not result.stdout.strip().isdigit() or size == 0:
        return None
    return min(1.0, int(result.stdout.strip()) / size)  # whole pages: the tail rounds up


def ensure_cached(path: Path, chunk: int = 16 << 20) -> None:
    """Read `path` into the page cache unless `fincore` says it is all there already."""
    cached = cached_fraction(path)
    if cached is not None and cached >= 0.999:
        return
    buffer = bytearray(chunk)
    with path.open("rb", buffering=0) as f:
        while f.readinto(buffer):
            pass
