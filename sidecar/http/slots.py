"""At most so many requests in flight to each upstream endpoint; the rest wait their turn."""

from __future__ import annotations

import asyncio
import collections
import contextlib

# Far above any model server's parallel slots, low enough that thousands of requests
# released at once wait for a turn instead of exhausting descriptors.
MAX_IN_FLIGHT_PER_ENDPOINT = 1024


class EndpointSlots:
    """At most `limit` requests in flight to each upstream endpoint; the rest wait here.

    Waiting here costs microseconds, whereas a request parked in aiohttp's connector pool
    has already paid for building itself: when a swap releases thousands of held requests
    in one loop iteration, only `limit` of them do that work (and start connect timers)
    at once, so the timers are not starved by the others.

    Paid on every proxied request, so the free path is a counter and no object: waiters
    (first come, first served) exist only while an endpoint is at its limit, and an
    endpoint is forgotten once unused, as pod addresses come and go.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._busy: dict[str, int] = {}
        self._waiters: dict[str, collections.deque[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """How many endpoints have a request in flight or waiting."""
        return len(self._busy)

    def take(self, endpoint: str) -> bool:
        """Take a free slot of `endpoint` at once, if there is one (no one waits for it)."""
        busy = self._busy.get(endpoint, 0)
        if busy < self._limit and endpoint not in self._waiters:
            self._busy[endpoint] = busy + 1
            return True
        return False

    async def acquire(self, endpoint: str) -> None:
        """Take a slot of `endpoint`; give it back with `release` (try/finally)."""
        if self.take(endpoint):
            return
        waiters = self._waiters.setdefault(endpoint, collections.deque())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(endpoint)  # handed a slot just as it was cancelled
            else:
                with contextlib.suppress(ValueError):  # already skipped by `release`
                    waiters.remove(future)
                self._tidy(endpoint)
            raise

    def release(self, endpoint: str) -> None:
        waiters = self._waiters.get(endpoint)
        while waiters:
            future = waiters.popleft()
            if not future.done():  # a cancelled waiter is skipped
                # The slot passes to the next waiter: the count stays as it is.
                future.set_result(None)
                self._tidy(endpoint)
                return
        self._busy[endpoint] -= 1
        self._tidy(endpoint)

    def _tidy(self, endpoint: str) -> None:
        waiters = self._waiters.get(endpoint)
        if waiters is not None and not waiters:
            del self._waiters[endpoint]
            waiters = None
        if waiters is None and self._busy.get(endpoint) == 0:
            del self._busy[endpoint]
