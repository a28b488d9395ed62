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
