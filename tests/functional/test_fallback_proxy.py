"""Fall through instead of waiting, through the router: a backend with activation Never
or IfIdle is answered by its fallback instead of being held, the client's `model` reaches
the fallback unchanged unless the fallback names another, and `X-Modelpool-Backend` says
who answered. The choice itself is tests/unit/test_fallback.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar.app import Live, make_app
from sidecar.config import parse_config
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import (
    StandInActivation,
    config_json,
    serve_app,
    until,
    url_backend,
)

pytestmark = pytest.mark.functional


@asynccontextmanager
async def recording_upstream() -> AsyncIterator[tuple[str, list[str]]]:
    """An upstream that answers every chat completion and records the `model` it was sent."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        model = (await request.json())["model"]
        seen.append(model)
        return web.json_response({"object": "chat.completion", "model": model, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"},
             "finish_reason": "stop"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with serve_app(app) as url:
        yield url, seen


@asynccontextmanager
async def router(big: dict[str, Any], upstream: str
                 ) -> AsyncIterator[tuple[str, StandInActivation]]:
    """`big` is pooled (held until released); `small` is a plain URL."""
    backends = [{**url_backend("big", upstream, pool="slot"), **big},
                url_backend("small", upstream)]
    config = parse_config(config_json(backends))
    metrics = RouterMetrics(CollectorRegistry(), "chat")
    activation = StandInActivation(config, metrics)
    async with serve_app(make_app(Live(config), activation, metrics)) as url:
        yield url, activation


async def ask(http: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    """(status, the backend that answered, the model of the reply) for a request for big."""
    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        reply = json.loads(await response.read())
        return response.status, response.headers["X-Modelpool-Backend"], reply["model"]


async def test_never_sends_the_request_to_the_fallback_with_the_clients_model() -> None:
    async with recording_upstream() as (upstream, seen), \
            router({"activation": "Never", "fallback": {"backend": "small", "model": None}},
                   upstream) as (url, activation), aiohttp.ClientSession() as http:
        assert await ask(http, url) == (200, "small", "big")
        assert activation.held == 0
        activation.release()  # big is resident now: it answers itself
        assert await ask(http, url) == (200, "big", "big")
    assert seen == ["big", "big"]


async def test_a_fallback_that_names_a_model_sends_that_one() -> None:
    async with recording_upstream() as (upstream, seen), \
            router({"activation": "Never", "fallback": {"backend": "small", "model": "tiny"}},
                   upstream) as (url, _), aiohttp.ClientSession() as http:
        assert await ask(http, url) == (200, "small", "tiny")
    assert seen == ["tiny"]


async def test_if_idle_holds_only_when_the_swap_can_start_at_once() -> None:
    async with recording_upstream() as (upstream, _), \
            router({"activation": "IfIdle", "fallback": {"backend": "small", "model": None}},
                   upstream) as (url, activation), aiohttp.ClientSession() as http:
        activation.incumbent_idle = False
        assert await ask(http, url) == (200, "small", "big")
        activation.incumbent_idle = True
        held = asyncio.create_task(ask(http, url))
        await until(lambda: activation.held == 1)
        activation.release()
        assert await held == (200, "big", "big")


async def test_wait_holds_as_before() -> None:
    async with recording_upstream() as (upstream, _), \
            router({"fallback": {"backend": "small", "model": None}}, upstream) \
            as (url, activation), aiohttp.ClientSession() as http:
        activation.incumbent_idle = False
        held = asyncio.create_task(ask(http, url))
        await until(lambda: activation.held == 1)
        activation.release()
        assert await held == (200, "big", "big")
