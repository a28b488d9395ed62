"""List, then watch: how every program here keeps up with a kind of object.

A list gives the objects and the version it was read at; a watch from that version gives
every change after it, with bookmarks (a version and nothing else) while nothing changes.
The server ends each watch after `timeout_seconds`, so that a dead connection shows as a
missing end rather than as silence, and the watch is resumed from the last version seen.
When that version is too old the server answers 410 Gone (as the answer, or as an ERROR
event in the stream): the objects are listed again. Any other failure is waited out, then
listed again or resumed, as the program's `Retry` says.

The loop is given the list and the watch as functions, so it runs over any client (each
program's kube module, or a test's fake of it). It imports neither kr8s nor httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

Json = dict[str, Any]
T = TypeVar("T")


class Gone(Exception):
    """410: the version a watch resumes from is too old; list again. Each program's own
    error for it derives from this one."""


@dataclass(frozen=True)
class Listed:
    """Every object, as a list (all of its pages) read them, and the list's version."""

    items: Sequence[Json]
    version: str


@dataclass(frozen=True)
class Event:
    """One change a watch reported: ADDED, MODIFIED or DELETED, and the object."""

    type: str
    object: Json


@dataclass(frozen=True)
class Retry:
    """How a list-then-watch waits out a failure: `delay(n)` seconds after the n-th in a
    row, then it lists again (`relist`) or resumes the watch from the last version seen.
    `failures` are the errors it waits out; any other ends it."""

    delay: Callable[[int], float]
    relist: bool = True
    failures: tuple[type[Exception], ...] = (Exception,)


Lister = Callable[[], Awaitable[tuple[Sequence[Json], str]]]
Watcher = Callable[[str], AsyncIterator[tuple[str, Json]]]


def watch_params(
    resource_version: str,
    timeout_seconds: int,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> dict[str, str]:
    """The query of a watch from `resource_version` on, bookmarks included, ended by the
    server after `timeout_seconds`."""
    params = {
        "watch": "true",
        "resourceVersion": resource_version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(timeout_seconds),
    }
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


@contextlib.asynccontextmanager
async def closing(events: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """`events`, closed on the way out when it is a generator. A generator that yields
    another's items must close it when it is closed itself: left open, the inner one (and
    the connection of its watch) would be finalized later, without its event loop."""
    try:
        yield events
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def version_of(obj: Mapping[str, Any], default: str) -> str:
    """An object's resourceVersion, or `default` when it carries none."""
    return str((obj.get("metadata") or {}).get("resourceVersion", default))


async def list_then_watch(
    list_: Lister,
    watch: Watcher,
    *,
    what: str,
    retry: Retry,
    logger: logging.Logger,
) -> AsyncIterator[Listed | Event]:
    """`Listed` after every list, then an `Event` for every change the watch reports
    (bookmarks only move the version on). Never ends on its own. `what` names the watch in
    the log lines, which go to the program's own `logger`."""
    version: str | None = None
    failures = 0
    while True:
        try:
            if version is None:
                items, version = await list_()
                failures = 0
                yield Listed(items, version)
            async with closing(watch(version)) as events:
                async for type_, obj in events:
                    version = version_of(obj, version)
                    failures = 0
                    if type_ != "BOOKMARK":
                        yield Event(type_, obj)
            # the server ended the watch (timeoutSeconds): resume where it stopped
        except Gone:
            logger.info("watch of %s expired (410 Gone); listing again", what)
            version = None
        except retry.failures as e:
            failures += 1
            delay = retry.delay(failures)
            logger.warning("watch of %s failed (%s); again in %.1fs", what, e, delay)
            await asyncio.sleep(delay)
            if retry.relist:
                version = None
