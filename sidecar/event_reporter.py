"""The router's Events on its ModelPools, posted in the background.

`sidecar.events` decides which Events to post (and rate-limits them); the `EventReporter`
here posts them through an `EventPort` without ever making a request wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sidecar import events
from sidecar.events import Note, Post

logger = logging.getLogger(__name__)

_EVENT_TIMEOUT = 10.0  # one Event's POST; the reporter gives up on it after that
_EVENT_BACKLOG = 64  # posts waiting to be sent; past it new ones are dropped (and logged)


@runtime_checkable
class EventPort(Protocol):
    """Creates an Event on a ModelPool (`sidecar.kube.KubeClient` is one)."""

    async def post_event(self, post: Post, instance: str) -> None: ...


class EventReporter:
    """Posts the Events `sidecar.events` decides on, without ever making a request wait.

    `note` is synchronous and cheap: the rate limiter runs at once, and what it lets
    through queues for `run`, one task that sends the posts one at a time, each bounded by
    a timeout. A post that fails is dropped: the first failure of each reason is logged as
    a warning, repeats at debug until one of that reason succeeds again."""

    def __init__(
        self,
        port: EventPort,
        instance: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        window: float = events.WINDOW_SECONDS,
        timeout: float = _EVENT_TIMEOUT,
    ) -> None:
        self._port = port
        self._instance = instance
        self._clock = clock
        self._limiter = events.Limiter(window=window)
        self._timeout = timeout
        self._posts: asyncio.Queue[Post] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._failing: set[str] = set()  # reasons whose last post failed (logged once)
        self._dropped = 0

    def note(self, note: Note) -> None:
        self._limiter, posts = events.offer(self._limiter, note, self._clock())
        self._enqueue(posts)
        self._wake.set()  # the next summary may be due sooner

    async def run(self) -> None:
        """Send posts, and summaries as their windows close. Runs until cancelled."""
        while True:
            self._limiter, posts = events.due(self._limiter, self._clock())
            self._enqueue(posts)
            while not self._posts.empty():
                await self._send(self._posts.get_nowait())
            due = events.next_due(self._limiter)
            self._wake.clear()
            wait = None if due is None else max(0.0, due - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    def _enqueue(self, posts: list[Post]) -> None:
        for post in posts:
            if self._posts.qsize() >= _EVENT_BACKLOG:
                self._dropped += 1
                if self._dropped == 1:
                    logger.warning(
                        "pool %s/%s: too many Events waiting to be posted; dropping %s",
                        post.namespace,
                        post.pool,
                        post.reason,
                    )
                continue
            self._posts.put_nowait(post)

    async def _send(self, post: Post) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._port.post_event(post, self._instance)
        except Exception as e:
            level = logging.DEBUG if post.reason in self._failing else logging.WARNING
            self._failing.add(post.reason)
            logger.log(
                level,
                "pool %s/%s: could not post Event %s: %s",
                post.namespace,
                post.pool,
                post.reason,
                e or type(e).__name__,
            )
            return
        self._failing.discard(post.reason)
        self._dropped = 0
        logger.debug("pool %s/%s: posted Event %s", post.namespace, post.pool, post.reason)
