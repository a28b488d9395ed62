"""A real llama-server charged to a shared fake GPU's memory ledger (e2e/llama/charged.py,
the llama-server image's entrypoint on kind): the charge is held by llama-server itself
(the entry execs it: same pid), servers that fit run side by side, one that does not fit
exits 3 before llama-server starts, and an exit frees the room."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from e2e.fake_model.gpu_ledger import live_charges
from e2e.fake_model.harness import free_port
from e2e.llama import models
from tests.functional.test_llama_contract import _healthy, llama_server_binary

pytestmark = [pytest.mark.functional, pytest.mark.build("llama-server")]

GIB = 1 << 30


def charged_env(locks: Path, footprint: int | None) -> dict[str, str]:
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "0", "MODELPOOL_GPU_LOCK_DIR": str(locks),
           "MODELPOOL_GPU_MEMORY": str(8 * GIB)}
    if footprint is not None:
        env["MODELPOOL_GPU_FOOTPRINT"] = str(footprint)
    return env


async def start(model: Path, env: dict[str, str], log: Path) -> tuple[
        asyncio.subprocess.Process, str]:
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "e2e.llama.charged", str(llama_server_binary()),
            "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "256",
            env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def running(model: Path, env: dict[str, str], log: Path) -> AsyncIterator[
        asyncio.subprocess.Process]:
    process, url = await start(model, env, log)
    try:
        await _healthy(url, process)
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def test_real_servers_share_a_device_by_its_ledger(tmp_path: Path) -> None:
    locks, model = tmp_path / "locks", models.write_model(tmp_path / "models", "gemma")
    async with running(model, charged_env(locks, 3 * GIB), tmp_path / "a.log") as a:
        async with running(model, charged_env(locks, 4 * GIB), tmp_path / "b.log") as b:
            assert sorted((c.pid, c.bytes) for c in live_charges(locks, "0")) == sorted(
                [(a.pid, 3 * GIB), (b.pid, 4 * GIB)])
            third, _ = await start(model, charged_env(locks, 2 * GIB), tmp_path / "c.log")
            assert await third.wait() == 3
            log = (tmp_path / "c.log").read_text()
            assert "GPU 0 out of memory" in log and "llama" not in log.lower(), log
        # b exited: its room is free again.
        async with running(model, charged_env(locks, 2 * GIB), tmp_path / "d.log") as d:
            assert sorted(c.pid for c in live_charges(locks, "0")) == sorted([a.pid, d.pid])
    assert live_charges(locks, "0") == []


async def test_a_shared_device_without_a_footprint_refuses_to_start(tmp_path: Path) -> None:
    model = models.write_model(tmp_path / "models", "gemma")
    process, _ = await start(model, charged_env(tmp_path / "locks", None), tmp_path / "a.log")
    assert await process.wait() == 2
    assert "MODELPOOL_GPU_FOOTPRINT" in (tmp_path / "a.log").read_text()


async def test_an_exclusive_device_runs_the_server_uncharged(tmp_path: Path) -> None:
    locks, model = tmp_path / "locks", models.write_model(tmp_path / "models", "gemma")
    env = {k: v for k, v in charged_env(locks, GIB).items() if k != "MODELPOOL_GPU_MEMORY"}
    async with running(model, env, tmp_path / "a.log"):
        assert not (locks / "gpu0.charges").exists()
