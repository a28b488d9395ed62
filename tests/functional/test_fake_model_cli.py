"""The fake model server started with the command lines that pods give llama-server and
vLLM (docs/contracts.md sections 3 and 4), answering the openai SDK; the parsing itself is
tests/unit/test_fake_model_settings.py."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from e2e.fake_model.harness import run_fake_model
from tests.unit.test_fake_model_settings import LLAMA_SERVER_ARGV, VLLM_ARGV

pytestmark = pytest.mark.functional


async def test_llama_server_command_line(tmp_path: Path) -> None:
    # --host 0.0.0.0 gives way to MODELPOOL_BIND_HOST (the harness binds to loopback), and
    # the harness's own --port comes last and wins over --port 18080.
    async with run_fake_model(*LLAMA_SERVER_ARGV, log_path=tmp_path / "llama.log") as server:
        assert server.host == "127.0.0.1"
        async with openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="unused", max_retries=0
        ) as client:
            ids = [model.id async for model in client.models.list()]
            reply = await client.chat.completions.create(
                model="qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    assert ids == ["/models/qwen.gguf"]  # llama-server's way: the path as given
    assert reply.model == "/models/qwen.gguf"
    assert reply.choices[0].message.content == "the pool"
    assert "-ngl 99" in server.log()  # logged as ignored


async def test_vllm_command_line(tmp_path: Path) -> None:
    async with (
        run_fake_model(*VLLM_ARGV, log_path=tmp_path / "vllm.log") as server,
        openai.AsyncOpenAI(
            base_url=server.openai_base_url, api_key="unused", max_retries=0
        ) as client,
    ):
        ids = [model.id async for model in client.models.list()]
        reply = await client.completions.create(model="qwen", prompt="hi", max_tokens=2)
    assert ids == ["qwen"]
    assert reply.choices[0].text == "the pool"
