"""How the kube adapter (sidecar.kube) creates the router's Events.

The transport is scripted the way kr8s answers `call_api` (a context manager over an httpx
response); the real API server, with the router's own token and Role, is exercised in
e2e/tests/test_router_events.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from sidecar.events import NORMAL, SWAP_REQUESTED, Post
from sidecar.kube import KubeClient
from sidecar.kube_port import KubeError

pytestmark = pytest.mark.unit

NS = "demo"
POST = Post(NS, "heavy", NORMAL, SWAP_REQUESTED, "router chat asked for gemma")
POOL = {"metadata": {"name": "heavy", "namespace": NS, "uid": "uid-7", "resourceVersion": "5"}}


class ScriptedApi:
    """Answers each call with the next scripted response; records every call."""

    def __init__(self, *replies: httpx.Response | Exception) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @asynccontextmanager
    async def call_api(self, method: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        # kr8s must never read a refusal itself (kubecore.refusal says why)
        assert kwargs.get("raise_for_status") is False, kwargs
        self.calls.append((method, kwargs))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        yield reply


def client(api: ScriptedApi) -> KubeClient:
    return KubeClient(api, wall_clock=lambda: datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC))


async def test_an_event_names_the_pool_by_the_uid_read_before() -> None:
    api = ScriptedApi(httpx.Response(200, json=POOL), httpx.Response(201, json={}))
    kube = client(api)
    await kube.get_pool(NS, "heavy")
    await kube.post_event(POST, "chat-7d9c")
    method, call = api.calls[1]
    assert (method, call["version"], call["namespace"], call["url"]) == (
        "POST",
        "v1",
        NS,
        "events",
    )
    # No kr8s re-authentication (and new session) on a refusal: see the next test.
    assert call["raise_for_status"] is False
    body = json.loads(call["content"])
    assert body["involvedObject"]["uid"] == "uid-7"
    assert body["reportingInstance"] == "chat-7d9c"


async def test_an_unknown_pool_is_read_first_for_its_uid() -> None:
    api = ScriptedApi(httpx.Response(200, json=POOL), httpx.Response(201, json={}))
    await client(api).post_event(POST, "chat-7d9c")
    assert [(m, c["url"]) for m, c in api.calls] == [
        ("GET", "modelpools/heavy"),
        ("POST", "events"),
    ]
    assert json.loads(api.calls[1][1]["content"])["involvedObject"]["uid"] == "uid-7"


async def test_a_refused_event_is_a_kube_error() -> None:
    api = ScriptedApi(
        httpx.Response(200, json=POOL),
        httpx.Response(403, json={"message": 'events is forbidden: cannot create "events"'}),
    )
    with pytest.raises(KubeError, match="HTTP 403"):
        await client(api).post_event(POST, "chat-7d9c")


async def test_an_event_on_a_pool_that_is_gone_is_a_kube_error() -> None:
    api = ScriptedApi(httpx.Response(404, json={"kind": "Status", "reason": "NotFound",
                                                "message": 'modelpools "slot" not found'}))
    with pytest.raises(KubeError, match="not found"):
        await client(api).post_event(POST, "chat-7d9c")
    assert [m for m, _ in api.calls] == ["GET"]  # nothing posted
