"""The informer's list-then-watch loop, over a fake of our own `Kube` port: a watch that
expires (410 Gone) is resumed by listing again, and objects that vanished meanwhile are
reported deleted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from reconciler.kube import MODEL_POOLS, Gone, Informer, Kube

pytestmark = pytest.mark.unit


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)}}


class FakeKube(Kube):
    def __init__(self) -> None:
        super().__init__(api=None)
        self.lists = [([obj("a", 1), obj("b", 2)], "2"), ([obj("a", 5)], "5")]
        self.watched_from: list[str] = []
        self.more = asyncio.Event()

    async def list_all(self, resource: Any, namespace: Any,
                       label_selector: Any = None) -> tuple[list[dict[str, Any]], str]:
        return self.lists.pop(0)

    async def watch(self, resource: Any, namespace: Any, resource_version: str,
                    label_selector: Any = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(resource_version)
        if len(self.watched_from) == 1:
            yield "MODIFIED", obj("a", 3)
            yield "BOOKMARK", obj("", 4)
            raise Gone("too old", 410)
        yield "ADDED", obj("c", 6)
        await self.more.wait()


async def test_a_gone_watch_lists_again_and_reports_what_vanished() -> None:
    kube = FakeKube()
    seen: list[tuple[str, str]] = []
    added_c = asyncio.Event()

    def on_change(type_: str, o: dict[str, Any]) -> None:
        seen.append((type_, o["metadata"]["name"]))
        if seen[-1] == ("ADDED", "c"):
            added_c.set()

    informer = Informer(kube, MODEL_POOLS, "ns", on_change)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(added_c.wait(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert kube.watched_from == ["2", "5"]
    assert seen == [
        ("SYNC", "a"), ("SYNC", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"), ("SYNC", "a"),
        ("ADDED", "c"),
    ]
    assert sorted(informer.cache) == [("ns", "a"), ("ns", "c")]
    assert informer.get("ns", "a") == obj("a", 5)


class LateWatch(FakeKube):
    """A watch whose event for an earlier write arrives after the informer cached the answer
    of a later write of ours."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = [([obj("a", 1)], "1")]
        self.wrote = asyncio.Event()

    async def watch(self, resource: Any, namespace: Any, resource_version: str,
                    label_selector: Any = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await self.wrote.wait()
        yield "MODIFIED", obj("a", 3)
        await self.more.wait()


async def test_a_late_watch_event_never_replaces_a_newer_write_in_the_cache() -> None:
    kube = LateWatch()
    seen = asyncio.Event()
    informer = Informer(kube, MODEL_POOLS, "ns", lambda t, o: seen.set() if t == "MODIFIED"
                        else None)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        informer.update(obj("a", 4))  # what our own write answered
        kube.wrote.set()
        await asyncio.wait_for(seen.wait(), 5)
        cached = informer.get("ns", "a")
        assert cached is not None and cached["metadata"]["resourceVersion"] == "4"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class DeletingWatch(FakeKube):
    """A watch that reports `a` deleted while a write of ours to it is still on its way."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = [([obj("a", 1)], "1")]

    async def watch(self, resource: Any, namespace: Any, resource_version: str,
                    label_selector: Any = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        yield "DELETED", obj("a", 5)
        await self.more.wait()


async def test_a_write_answered_before_a_delete_never_brings_the_object_back() -> None:
    kube = DeletingWatch()
    deleted = asyncio.Event()
    informer = Informer(kube, MODEL_POOLS, "ns", lambda t, o: deleted.set() if t == "DELETED"
                        else None)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(deleted.wait(), 5)
        informer.update(obj("a", 4))  # a status patch answered just before the delete
        assert informer.get("ns", "a") is None
        informer.update(obj("b", 1))  # older than the list: it was gone when we listed
        assert informer.get("ns", "b") is None
        informer.update(obj("a", 6))  # created again
        cached = informer.get("ns", "a")
        assert cached is not None and cached["metadata"]["resourceVersion"] == "6"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
