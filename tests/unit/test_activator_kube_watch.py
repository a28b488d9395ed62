"""The kube adapter's watch loop (sidecar.kube): list, watch from the list's version,
resume from the last version after a dropped stream, list again after 410 Gone.

The transport is scripted by `ScriptedApi`, which answers `call_api` the way kr8s does
with `raise_for_status=False` (a context manager over an httpx response, whatever its
status); the real API server is exercised in tests/integration/test_router_kube.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from sidecar.kube import KubeClient
from sidecar.kube_port import Changed, Deleted, Listed

pytestmark = pytest.mark.unit


def pool(name: str, rv: str, member: str | None = None) -> dict[str, Any]:
    status = {"request": {"member": member, "generation": 1}} if member else {}
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": status}


class Lines:
    status_code = 200

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    async def aiter_lines(self) -> AsyncIterator[str]:
        for line in self._lines:
            yield line


class ScriptedApi:
    """Answers each call with the next scripted reply; records the query of every call."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies
        self.calls: list[dict[str, Any]] = []

    @asynccontextmanager
    async def call_api(self, method: str, **kwargs: Any) -> AsyncIterator[Any]:
        # kr8s must never read a refusal itself (kubecore.refusal says why)
        assert kwargs.get("raise_for_status") is False, kwargs
        self.calls.append(dict(kwargs.get("params") or {}))
        if not self.replies:
            await asyncio.Event().wait()  # no more script: a quiet watch
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, Lines | httpx.Response):
            yield reply
        else:
            yield httpx.Response(200, json=reply)


def event(kind: str, obj: dict[str, Any]) -> str:
    return json.dumps({"type": kind, "object": obj})


def gone() -> httpx.Response:
    return httpx.Response(410, json={"kind": "Status", "reason": "Expired",
                                     "message": "too old resource version: 1 (7)"})


async def take(events: AsyncIterator[Any], n: int) -> list[Any]:
    out = []
    async with asyncio.timeout(5):
        for _ in range(n):
            out.append(await anext(events))
    return out


async def test_watch_resumes_and_lists_again_after_gone() -> None:
    api = ScriptedApi(
        [
            {"metadata": {"resourceVersion": "10"}, "items": [pool("heavy", "9")]},
            Lines(
                [
                    event("MODIFIED", pool("heavy", "11", "gemma")),
                    "",
                    event("BOOKMARK", {"metadata": {"resourceVersion": "12"}}),
                ]
            ),  # the server ends the stream (timeoutSeconds): resume from 12
            Lines([event("ERROR", {"kind": "Status", "code": 410, "message": "too old"})]),
            {"metadata": {"resourceVersion": "20"}, "items": [pool("heavy", "19", "phi")]},
            Lines([event("DELETED", pool("heavy", "21"))]),
            gone(),  # the watch request itself answered 410
            {"metadata": {"resourceVersion": "30"}, "items": []},
        ]
    )
    events = KubeClient(api).watch_pools("demo")
    got = await take(events, 5)
    assert isinstance(got[0], Listed) and got[0].items[0].name == "heavy"
    assert isinstance(got[1], Changed) and got[1].item.request.member == "gemma"
    assert isinstance(got[2], Listed) and got[2].items[0].request.member == "phi"
    assert got[3] == Deleted("heavy")
    assert got[4] == Listed(())
    assert [c.get("resourceVersion") for c in api.calls] == [
        None,  # list
        "10",  # watch from the list
        "12",  # resume after the stream ended, from the bookmark
        None,  # 410 event: list again
        "20",
        "21",  # resume after the deletion
        None,  # 410 answer: list again
    ]
    assert all(c.get("watch") == "true" for c in api.calls if "resourceVersion" in c)
    await events.aclose()  # type: ignore[attr-defined]


async def test_watch_retries_after_a_dropped_connection() -> None:
    api = ScriptedApi(
        [
            {"metadata": {"resourceVersion": "10"}, "items": []},
            httpx.ConnectError("connection refused"),
            Lines([event("ADDED", pool("heavy", "11"))]),
        ]
    )
    events = KubeClient(api).watch_endpoint_slices("demo")
    got = await take(events, 2)
    assert got[0] == Listed(())
    assert isinstance(got[1], Changed)
    assert [c.get("resourceVersion") for c in api.calls[:3]] == [None, "10", "10"]
    assert api.calls[0]["labelSelector"] == "kubernetes.io/service-name"
    await events.aclose()  # type: ignore[attr-defined]
