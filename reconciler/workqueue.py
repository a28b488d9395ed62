"""A keyed work queue: each object is reconciled by one worker at a time, once per burst.

Watch events arrive in bursts (a Deployment's status changes five times while it rolls
out); the reconciler only needs to look at the object again, not once per event. So a
key is queued at most once, a key added while a worker holds it is queued again when the
worker is done (never handed to two workers), delayed adds keep the earliest deadline,
and a key whose reconcile failed comes back after an exponential backoff with jitter,
reset by its first success. The same semantics as client-go's rate-limited queue.

Keys an `urgent` predicate picks are served before the others, first come first served
among themselves: the reconciler's pools, whose swaps someone waits for, go ahead of the
bookkeeping of servers and routers (a restart queues every object at once).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """The queue was shut down; workers stop."""


@dataclass(frozen=True)
class Backoff:
    base: float = 0.1
    maximum: float = 60.0
    jitter: float = 0.2  # up to this fraction is added at random, so retries spread out

    def delay(self, failures: int, rand: float) -> float:
        """The wait before retry number `failures` (1-based); `rand` is in [0, 1)."""
        exponent = min(max(failures - 1, 0), 32)
        return float(min(self.maximum, self.base * 2.0**exponent) * (1 + self.jitter * rand))


class WorkQueue(Generic[K]):
    def __init__(
        self, backoff: Backoff | None = None, rand: Callable[[], float] = random.random,
        urgent: Callable[[K], bool] | None = None,
    ) -> None:
        self._backoff = backoff or Backoff()
        self._rand = rand
        self._urgent = urgent
        # urgent keys first (`_urgent_queued` of them), then the others, each in arrival order
        self._queue: deque[K] = deque()
        self._urgent_queued = 0
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[K, int] = {}
        self._wakeup = asyncio.Event()
        self._shut_down = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again by done()
        self._push(key)

    def _push(self, key: K) -> None:
        if self._urgent is not None and self._urgent(key):
            self._urgent_queued = min(self._urgent_queued, len(self._queue)) + 1
            self._queue.insert(self._urgent_queued - 1, key)
        else:
            self._queue.append(key)
        self._wakeup.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        if self._shut_down:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= deadline:
                return
            existing[1].cancel()
        self._timers[key] = (deadline, loop.call_at(deadline, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        """The next key, marked as being processed until `done`. It always lets the event
        loop run first, even with keys waiting: a worker whose reconcile awaits nothing
        that suspends and whose key comes straight back (a wake already due) would else
        hold the loop forever, and with it the answers it waits for (an idle probe), the
        watches and the health server."""
        await asyncio.sleep(0)
        while not self._queue:
            if self._shut_down:
                raise QueueShutDown
            self._wakeup.clear()
            await self._wakeup.wait()
        key = self._queue.popleft()
        self._urgent_queued = max(0, self._urgent_queued - 1)
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._push(key)

    def retry(self, key: K) -> float:
        """Count a failure of `key` and queue it again after the backoff; the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self._backoff.delay(failures, self._rand())
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """`key` succeeded: its next failure starts the backoff from the beginning."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def shutdown(self) -> None:
        self._shut_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._queue.clear()
        self._urgent_queued = 0
        self._wakeup.set()
