"""The official `openai` SDK through the router to the fake model server: what a user's
client sees, streaming and not, and the router's errors as the SDK raises them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry

from e2e.fake_model.harness import run_fake_model
from sidecar.activation import Activation
from sidecar.app import Live, make_app
from sidecar.config import parse_config
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import config_json, serve_app, url_backend

pytestmark = pytest.mark.functional


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AsyncOpenAI]:
    async with run_fake_model(
        "--model", "/models/coder.gguf", "--tokens-per-second", "200",
        log_path=tmp_path / "fake.log",
    ) as server:  # fmt: skip
        config = parse_config(config_json([url_backend("coder", server.base_url, "qwen")]))
        metrics = RouterMetrics(CollectorRegistry(), "chat")
        activation = Activation(config, None, metrics, identity="test/chat/pod")
        async with (
            serve_app(make_app(Live(config), activation, metrics)) as url,
            AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk,
        ):
            yield sdk


async def test_chat_completion_through_the_router(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 5


async def test_streamed_chat_completion_through_the_router(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": "hello"}], max_tokens=6, stream=True
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 3


async def test_models_and_errors_as_the_sdk_sees_them(client: AsyncOpenAI) -> None:
    models = {m.id: m for m in (await client.models.list()).data}
    assert set(models) == {"coder", "qwen"}
    assert (await client.models.retrieve("qwen")).id == "qwen"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")
    with pytest.raises(openai.NotFoundError) as raised:
        await client.chat.completions.create(model="nope", messages=[])
    assert raised.value.code == "model_not_found"
