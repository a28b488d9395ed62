"""kubecore's list-then-watch over scripted lists and watches: the query every program
sends, a watch resumed from the last version (bookmarks included) when the server ends it,
a new list after 410 Gone, and a failure waited out, then listed again or resumed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from kubecore.watch import Event, Gone, Listed, Retry, list_then_watch, watch_params

pytestmark = pytest.mark.unit


def test_a_watch_resumes_from_its_version_with_bookmarks_and_a_server_timeout() -> None:
    assert watch_params("41", 290) == {
        "watch": "true",
        "resourceVersion": "41",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "290",
    }


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        ({"label_selector": "app=a"}, {"labelSelector": "app=a"}),
        ({"field_selector": "spec.nodeName=n"}, {"fieldSelector": "spec.nodeName=n"}),
        ({"label_selector": "", "field_selector": None}, {}),
    ],
)
def test_only_the_selectors_given_are_sent(
    selectors: dict[str, str | None], expected: dict[str, str]
) -> None:
    params = watch_params("1", 10, **selectors)
    assert {k: v for k, v in params.items() if k.endswith("Selector")} == expected


Json = dict[str, Any]
LOG = logging.getLogger("test")


def obj(name: str, rv: int) -> Json:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}}


class Script:
    """Lists answer in turn; each watch plays its events, then raises its ending (None: the
    server ends it) or, past the script, waits forever."""

    def __init__(self, lists: list[tuple[Sequence[Json], str]],
                 watches: list[tuple[list[tuple[str, Json]], Exception | None]]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[str] = []
        self._call = asyncio.Condition()

    async def called(self, n: int) -> None:
        """Wait until the list and the watches have been called `n` times in all."""
        async with self._call:
            await self._call.wait_for(lambda: len(self.calls) >= n)

    async def _note(self, call: str) -> None:
        async with self._call:
            self.calls.append(call)
            self._call.notify_all()

    async def list_(self) -> tuple[Sequence[Json], str]:
        await self._note("list")
        return self.lists.pop(0)

    async def watch(self, version: str) -> AsyncIterator[tuple[str, Json]]:
        await self._note(version)
        if not self.watches:
            await asyncio.Event().wait()
        events, ending = self.watches.pop(0)
        for event in events:
            yield event
        if ending is not None:
            raise ending


async def take(script: Script, retry: Retry, n: int) -> list[Listed | Event]:
    changes = list_then_watch(script.list_, script.watch, what="things", retry=retry,
                              logger=LOG)
    try:
        async with asyncio.timeout(5):
            return [await anext(changes) for _ in range(n)]
    finally:
        await changes.aclose()  # type: ignore[attr-defined]


class Failed(Exception):
    pass


async def test_a_watch_resumes_from_the_last_version_and_lists_again_after_gone() -> None:
    script = Script(
        lists=[([obj("a", 1)], "2"), ([obj("a", 5)], "6")],
        watches=[
            ([("MODIFIED", obj("a", 3)), ("BOOKMARK", obj("", 4))], None),  # the server ends it
            ([], Gone()),
        ],
    )
    got = await take(script, Retry(delay=lambda n: 0.0, relist=False), 3)  # only Gone lists
    assert got == [
        Listed([obj("a", 1)], "2"),
        Event("MODIFIED", obj("a", 3)),
        Listed([obj("a", 5)], "6"),
    ]
    assert script.calls == ["list", "2", "4", "list"]


@pytest.mark.parametrize(("relist", "calls"), [
    (True, ["list", "2", "list", "3"]),
    (False, ["list", "2", "2"]),
])
async def test_a_failure_is_waited_out_then_listed_again_or_resumed(
    relist: bool, calls: list[str]
) -> None:
    delays: list[int] = []

    def delay(failures: int) -> float:
        delays.append(failures)
        return 0.0

    script = Script(lists=[([], "2"), ([], "3")], watches=[([], Failed("reset"))])
    changes = list_then_watch(script.list_, script.watch, what="things",
                              retry=Retry(delay, relist=relist, failures=(Failed,)), logger=LOG)
    consumer = asyncio.ensure_future(_drain(changes))
    try:
        async with asyncio.timeout(5):
            await script.called(len(calls))
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
    assert script.calls == calls
    assert delays == [1]


async def _drain(changes: AsyncIterator[Listed | Event]) -> None:
    async for _ in changes:
        pass


async def test_an_error_that_is_not_waited_out_ends_the_watch() -> None:
    script = Script(lists=[([], "2")], watches=[([], KeyError("metadata"))])
    with pytest.raises(KeyError):
        await take(script, Retry(delay=lambda n: 0.0, failures=(Failed,)), 2)
