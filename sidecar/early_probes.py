"""The early readiness probes of swaps' targets, at most one per pool.

While a swap's target is Loading and listed not-ready in its EndpointSlice, its pool's
prober GETs the member's readiness path there every `PROBE_INTERVAL` (through a
`ReadinessProbe`), and reports the first 200: the activation then dispatches held requests
to that address without waiting for the kubelet's next readiness probe. The activation
says which (member, address, path) each pool wants probed; this module keeps the probers
in step with that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)

PROBE_INTERVAL = 0.05  # between two early readiness probes of a swap's target
PROBE_TIMEOUT = 0.5  # one early readiness probe; a slow answer is a failed one

# What a pool's prober probes: (member, address "host:port", readiness path).
Wanted = tuple[str, str, str]


class ReadinessProbe(Protocol):
    """GETs `path` on `host:port` once; True only for a 200 within `probe_timeout` seconds,
    False for anything else (refused, timed out, another status). Never raises for those."""

    async def __call__(self, host: str, port: int, path: str, probe_timeout: float) -> bool: ...


@dataclass(frozen=True)
class _Prober:
    member: str
    address: str  # "host:port", listed not-ready in the member's EndpointSlice
    path: str
    task: asyncio.Task[None]


class EarlyProbes:
    """The probers of one router's pools. `answered(pool, member, address, path)` is called
    once a prober's member answers 200; that prober is then done."""

    def __init__(
        self,
        probe: ReadinessProbe | None,
        answered: Callable[[str, str, str, str], None],
    ) -> None:
        self._probe = probe
        self._answered = answered
        self._probers: dict[str, _Prober] = {}  # per pool: at most one

    def sync(self, pool: str, wanted: Wanted | None, tasks: asyncio.TaskGroup | None) -> bool:
        """Keep the pool's prober if it still probes `wanted`, else stop it; start one for
        `wanted` in `tasks` (None: none is started). True if one was started."""
        current = self._probers.get(pool)
        if current is not None and (
            current.task.done() or (current.member, current.address, current.path) != wanted
        ):
            current.task.cancel()
            del self._probers[pool]
            current = None
        if wanted is None or current is not None or tasks is None or self._probe is None:
            return False
        member, address, path = wanted
        task = tasks.create_task(self._until_ready(pool, member, address, path))
        self._probers[pool] = _Prober(member, address, path, task)
        return True

    def clear(self) -> None:
        """Forget every prober (their task group has cancelled them)."""
        self._probers.clear()

    async def _until_ready(self, pool: str, member: str, address: str, path: str) -> None:
        """Probe until the member answers 200, then report it. A failure is logged; the
        activation's machine recovers at its next deadline."""
        try:
            await self._probe_until_ready(address, path)
            prober = self._probers.get(pool)
            if prober is not None and prober.task is asyncio.current_task():
                del self._probers[pool]  # done: a later sync must not cancel this task
            self._answered(pool, member, address, path)
        except Exception:
            logger.exception("activation work failed")

    async def _probe_until_ready(self, address: str, path: str) -> None:
        assert self._probe is not None
        host, _, port = address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        while True:
            if await self._probe(host, int(port), path, PROBE_TIMEOUT):
                return
            # A fixed pace, not a wait for an event: nothing tells us when it is loaded.
            await asyncio.sleep(PROBE_INTERVAL)
