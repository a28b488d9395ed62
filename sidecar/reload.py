"""Reload the router config and API keys when they change.

In a cluster the config comes from the router's ConfigMap through the API (`follow`): a
watch sees a new config as soon as the reconciler writes it (a ModelRouter change was
routed 0.15 s after `kubectl apply` on kind), where the kubelet refreshes a mounted
ConfigMap only on a later sync of the pod (69 to 87 s there; docs/benchmarks.md). The
mounted file is the config at start, and the only source where the router runs without
the API (`--config` alone).

Files are polled: the kubelet and the local node agent replace a mounted ConfigMap or
Secret atomically (a new directory and a symlink swap), so inotify on the file would miss
it; the content is hashed every interval instead. A new config that does not parse keeps
the old one and logs an error once. Nothing here touches requests: the caller applies the
new config (routes, then `activation.update_config`), and held or in-flight requests keep
going.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from sidecar.kube_port import Deleted, Listed, WatchEvent

logger = logging.getLogger(__name__)

V = TypeVar("V")


@dataclass
class WatchedFile(Generic[V]):
    """One file, its parser (from the raw bytes), and what to do with a new value."""

    path: Path
    parse: Callable[[bytes], V]
    apply: Callable[[V], None]
    last_digest: bytes | None = None
    # What the logs call it, when its content comes from elsewhere than `path`.
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or str(self.path)

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
            logger.error("keeping the previous %s: the new one is invalid: %s", self.name, e)
            return False
        self.apply(value)
        logger.info("reloaded %s", self.name)
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


@dataclass(frozen=True)
class ConfigData:
    """A ConfigMap as the router reads it: its name and its `data`."""

    name: str
    data: dict[str, str]


async def follow(
    events: AsyncIterator[WatchEvent[ConfigData]], key: str, watched: WatchedFile[Any]
) -> None:
    """Apply `key` of the ConfigMap that `events` watch whenever it changes. A ConfigMap
    deleted, or without the key, keeps the config in force (the reconciler writes it
    again). Ends only when `events` does, which a watch never does."""
    async for event in events:
        if isinstance(event, Deleted):
            logger.warning("ConfigMap %s deleted: keeping the current config", event.name)
            continue
        items = event.items if isinstance(event, Listed) else (event.item,)
        if not items:
            logger.warning("%s not found: keeping the current config", watched.name)
        for item in items:
            content = item.data.get(key)
            if content is None:
                logger.warning("ConfigMap %s has no key %s: keeping the current config",
                               item.name, key)
                continue
            watched.check(content.encode())
