"""Reload the router config and API keys when their files change.

The kubelet and the local node agent replace a mounted ConfigMap or Secret atomically
(a new directory and a symlink swap), so inotify on the file would miss it; the content
is hashed every interval instead. A new config that does not parse keeps the old one and
logs an error once. Nothing here touches requests: the caller applies the new config
(routes, then `activation.update_config`), and held or in-flight requests keep going.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

V = TypeVar("V")


@dataclass
class WatchedFile(Generic[V]):
    """One file, its parser (from the raw bytes), and what to do with a new value."""

    path: Path
    parse: Callable[[bytes], V]
    apply: Callable[[V], None]
    last_digest: bytes | None = None

    def prime(self, content: bytes) -> None:
        """Remember `content` as already applied (it was loaded at start)."""
        self.last_digest = hashlib.sha256(content).digest()

    def check(self, content: bytes | None) -> bool:
        """Apply `content` if it changed; True if a new value was applied."""
        if content is None:
            return False
        digest = hashlib.sha256(content).digest()
        if digest == self.last_digest:
            return False
        self.last_digest = digest
        try:
            value = self.parse(content)
        except Exception as e:
            logger.error("keeping the previous %s: the new one is invalid: %s", self.path, e)
            return False
        self.apply(value)
        logger.info("reloaded %s", self.path)
        return True


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError as e:
        # Mid-swap the file may be briefly absent; the next poll sees the new one.
        logger.debug("cannot read %s: %s", path, e)
        return None


async def watch(files: Sequence[WatchedFile[Any]], interval: float = 1.0) -> None:
    """Poll `files` forever (reads off the event loop); never returns, cancel it."""
    while True:
        await asyncio.sleep(interval)
        for watched in files:
            watched.check(await asyncio.to_thread(read, watched.path))
