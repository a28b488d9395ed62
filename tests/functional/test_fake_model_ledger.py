"""The fake server on a shared device: servers charge their footprints to the device's
ledger, a load that would pass its memory fails loudly (exit 3, as a lock held elsewhere
does), an exit or a crash frees the charge, and vLLM's --gpu-memory-utilization sizes it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from e2e.fake_model.gpu_ledger import GpuLedger, GpuMemoryExhausted, live_charges
from e2e.fake_model.harness import run_fake_model, start_fake_model

pytestmark = pytest.mark.functional

GIB = 1 << 30


def shared(tmp_path: Path, footprint: int | None, device: str = "0") -> dict[str, str]:
    env = {"NVIDIA_VISIBLE_DEVICES": device, "MODELPOOL_GPU_LOCK_DIR": str(tmp_path / "locks"),
           "MODELPOOL_GPU_MEMORY": str(8 * GIB)}
    if footprint is not None:
        env["MODELPOOL_GPU_FOOTPRINT"] = str(footprint)
    return env


async def test_servers_that_fit_share_the_device_and_one_that_does_not_fails(
        tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    async with run_fake_model(log_path=tmp_path / "a.log", env=shared(tmp_path, 3 * GIB)) as a, \
            run_fake_model(log_path=tmp_path / "b.log", env=shared(tmp_path, 4 * GIB)) as b:
        assert sorted((c.pid, c.bytes) for c in live_charges(locks, "0")) == sorted(
            [(a.process.pid, 3 * GIB), (b.process.pid, 4 * GIB)])
        third = await start_fake_model(log_path=tmp_path / "c.log", env=shared(tmp_path, 2 * GIB))
        assert await third.wait_exit() == 3
        assert "GPU 0 out of memory" in third.log()
        assert f"capacity {8 * GIB}" in third.log()
        # Another device has its own ledger.
        async with run_fake_model(log_path=tmp_path / "d.log",
                                  env=shared(tmp_path, 6 * GIB, device="1")):
            pass
        assert await b.stop() == 0
        # b's exit freed its share: the third fits now.
        async with run_fake_model(log_path=tmp_path / "e.log", env=shared(tmp_path, 2 * GIB)):
            assert sum(c.bytes for c in live_charges(locks, "0")) == 5 * GIB
    assert live_charges(locks, "0") == []


async def test_a_crashed_server_leaves_nothing_charged(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    crashed = await start_fake_model(log_path=tmp_path / "a.log", env=shared(tmp_path, 7 * GIB))
    await crashed.wait_ready()
    assert [c.bytes for c in live_charges(locks, "0")] == [7 * GIB]
    os.kill(crashed.process.pid, signal.SIGKILL)
    await crashed.wait_exit()
    assert live_charges(locks, "0") == []
    # Its file is left behind; the next load finds it dead and takes the room.
    assert list((locks / "gpu0.charges").iterdir())
    with GpuLedger(locks, ("0",), 8 * GIB, 8 * GIB):
        pass
    assert not list((locks / "gpu0.charges").iterdir())


async def test_vllm_sizes_itself_by_its_memory_utilization(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    async with run_fake_model("--mode", "vllm", "--gpu-memory-utilization", "0.5",
                              log_path=tmp_path / "v.log", env=shared(tmp_path, None)):
        assert [c.bytes for c in live_charges(locks, "0")] == [4 * GIB]
        with pytest.raises(GpuMemoryExhausted) as full:
            GpuLedger(locks, ("0",), 4 * GIB + 1, 8 * GIB).acquire()
        assert full.value.charged == 4 * GIB
        with GpuLedger(locks, ("0",), 4 * GIB, 8 * GIB):
            pass


async def test_a_shared_device_without_a_footprint_is_a_settings_error(tmp_path: Path) -> None:
    server = await start_fake_model(log_path=tmp_path / "a.log", env=shared(tmp_path, None))
    assert await server.wait_exit() == 2
    assert "MODELPOOL_GPU_FOOTPRINT or --gpu-memory-utilization" in server.log()
