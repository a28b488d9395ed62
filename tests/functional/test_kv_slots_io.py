"""reconciler/kv_slots_io.py against the fake model server in llama.cpp mode (and one round
trip against the real llama-server): which slots a save takes and in what order, the caps,
a restore that brings a conversation's cache back into a new process, a manifest made for
another process that is not restored, and a server that cannot save that is reported."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.fake_model.harness import FakeModelProcess, run_fake_model
from reconciler.kv_cache import Saved
from reconciler.kv_slots_io import (
    Address,
    IdentityArgs,
    Skipped,
    SlotFiles,
    identity_hash,
    manifest_from,
    status_value,
)
from reconciler.spec import KvCache
from tests.functional.test_llama_contract import Server, started

pytestmark = pytest.mark.functional

MEMBER, UID = "gemma", "5f0c2a1e-0000-4000-8000-000000000001"
MODEL = IdentityArgs("/models/gemma.gguf", ("-c", "8192", "-ctk", "q8_0"))
KV = KvCache(persist=True, pvc="kv", save_timeout=30.0)
FIRST = " ".join(["the pool shares one GPU between its members"] * 6)
SECOND = " ".join(["a coding agent keeps a long session open"] * 4)
DAY = 86400.0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def fake(directory: Path | None, tmp_path: Path, *extra: str) -> Any:
    save = ["--slot-save-path", f"{directory}/"] if directory is not None else []
    return run_fake_model("--mode", "llamacpp", "--model", MODEL.model, "-np", "2", *save,
                          *extra, log_path=tmp_path / "fake.log")


def address(server: FakeModelProcess | Server) -> Address:
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def complete(http: aiohttp.ClientSession, base_url: str, prompt: str, slot: int,
                   max_tokens: int = 2) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "id_slot": slot}
    async with http.post(base_url + "/v1/completions", json=body) as r:
        answer: dict[str, Any] = await r.json()
        assert r.status == 200, answer
        return answer


async def processing(http: aiohttp.ClientSession, base_url: str, slot: int) -> None:
    """Returns once `/slots` reads `slot` as processing (a generation started on it)."""
    while True:
        async with http.get(base_url + "/slots") as r:
            if (await r.json())[slot]["is_processing"]:
                return


async def test_a_save_takes_every_used_slot_most_recently_used_first(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    async with fake(tmp_path, tmp_path) as server:
        first = await complete(http, server.base_url, FIRST, 0)
        second = await complete(http, server.base_url, SECOND, 1)
        report = await SlotFiles(http).save(address(server), MEMBER, UID, KV, MODEL,
                                            time.monotonic)
    assert report.error is None and report.skipped == ()
    assert [s.slot for s in report.saved] == [1, 0], "the most recently used first"
    hash8 = identity_hash(report.identity) if report.identity else ""
    assert [s.file for s in report.saved] == [f"gemma-5f0c2a1e-{hash8}-slot1.bin",
                                              f"gemma-5f0c2a1e-{hash8}-slot0.bin"]
    # A slot holds its prompt and what it generated.
    assert [s.tokens for s in report.saved] == [
        second["usage"]["total_tokens"], first["usage"]["total_tokens"]]
    for saved in report.saved:
        assert (tmp_path / saved.file).stat().st_size == saved.bytes
    assert report.identity is not None and report.identity.args == ("--cache-type-k", "q8_0")
    assert 0 < report.seconds < KV.save_timeout

    value = status_value(report, now=1000.0)
    assert value is not None and value["savedAt"] == 1000.0
    manifest = manifest_from(value)
    assert manifest.identity == report.identity and manifest.slots == report.saved


async def test_the_size_cap_stops_before_a_file_that_would_pass_it(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    files = SlotFiles(http)
    async with fake(tmp_path, tmp_path) as server:
        await complete(http, server.base_url, FIRST, 0)
        await complete(http, server.base_url, FIRST, 1)
        whole = await files.save(address(server), MEMBER, UID, KV, MODEL, time.monotonic)
        first_bytes = whole.saved[0].bytes
        capped = dataclasses.replace(KV, max_bytes=first_bytes + 1)
        report = await files.save(address(server), MEMBER, UID, capped, MODEL, time.monotonic)
    assert len(whole.saved) == 2
    assert [s.slot for s in report.saved] == [1]
    assert report.skipped == (Skipped(0, "size cap"),)


@pytest.mark.parametrize("kind", ["fake", pytest.param(
    "real", marks=pytest.mark.build("llama-server"))])
async def test_a_restore_into_a_new_process_serves_the_conversation_from_its_cache(
        kind: str, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.mkdir()
    extra = ["--slot-save-path", f"{slots}/"]
    async with started(kind, tmp_path, extra) as server:
        model = IdentityArgs(server.model_arg, ("-c", "2048"))
        first = await complete(http, server.base_url, FIRST, 1)
        report = await SlotFiles(http).save(address(server), MEMBER, UID, KV, model,
                                            time.monotonic)
    assert [s.slot for s in report.saved] == [1], report
    value = status_value(report, now=time.time())
    assert value is not None

    async with started(kind, tmp_path, extra) as server:
        restored = await SlotFiles(http).restore(address(server), manifest_from(value),
                                                 model, time.time(), DAY)
        assert restored.refused is None and restored.skipped == (), restored
        assert [(r.slot, r.tokens) for r in restored.restored] == [
            (1, report.saved[0].tokens)]
        turn = await complete(http, server.base_url, FIRST + " and one more turn", 1)
    # The earlier prompt is served from the restored cache.
    assert turn["timings"]["cache_n"] == first["usage"]["prompt_tokens"], turn["timings"]


async def test_a_manifest_made_for_another_process_is_not_restored(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    files = SlotFiles(http)
    async with fake(tmp_path, tmp_path) as server:
        await complete(http, server.base_url, FIRST, 0)
        report = await files.save(address(server), MEMBER, UID, KV, MODEL, time.monotonic)
    value = status_value(report, now=1000.0)
    assert value is not None
    manifest = manifest_from(value)
    other_context = dataclasses.replace(
        manifest, identity=dataclasses.replace(manifest.identity, n_ctx=1024))
    other_args = IdentityArgs(MODEL.model, ("-ctk", "f16"))

    async with fake(tmp_path, tmp_path) as server:
        where = address(server)
        assert (await files.restore(where, other_context, MODEL, 1000.0, DAY)).refused == (
            "made for another n_ctx")
        assert (await files.restore(where, manifest, other_args, 1000.0, DAY)).refused == (
            "made for another args")
        assert (await files.restore(where, manifest, MODEL, 1000.0 + DAY + 1, DAY)
                ).refused == "older than 86400s"
        turn = await complete(http, server.base_url, FIRST + " and one more turn", 0)
        assert turn["timings"]["cache_n"] == 0, "nothing was restored"
        # The same manifest, made for this process, restores (the file was fine).
        restored = await files.restore(where, manifest, MODEL, 1000.0, DAY)
    assert [r.slot for r in restored.restored] == [0] and restored.refused is None


async def test_a_file_the_server_cannot_restore_is_reported_and_the_rest_go_on(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    files = SlotFiles(http)
    async with fake(tmp_path, tmp_path) as server:
        await complete(http, server.base_url, FIRST, 0)
        await complete(http, server.base_url, SECOND, 1)
        report = await files.save(address(server), MEMBER, UID, KV, MODEL, time.monotonic)
    value = status_value(report, now=1000.0)
    assert value is not None
    manifest = manifest_from(value)
    (tmp_path / manifest.slots[0].file).unlink()
    async with fake(tmp_path, tmp_path) as server:
        restored = await files.restore(address(server), manifest, MODEL, 1000.0, DAY)
    assert [r.slot for r in restored.restored] == [manifest.slots[1].slot]
    [gone] = restored.skipped
    assert gone.slot == manifest.slots[0].slot
    assert "400" in gone.reason and "Unable to restore slot" in gone.reason


async def test_a_server_that_cannot_save_is_reported_not_raised(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    files = SlotFiles(http)
    async with fake(None, tmp_path) as server:
        await complete(http, server.base_url, FIRST, 0)
        await complete(http, server.base_url, SECOND, 1)
        report = await files.save(address(server), MEMBER, UID, KV, MODEL, time.monotonic)
        manifest = manifest_from({
            "version": 1, "savedAt": 1000.0, "slots": [dataclasses.asdict(Saved(0, "f", 3, 9))],
            "identity": {"model": MODEL.model, "model_size": 0, "model_mtime": 0,
                         "n_ctx": report.identity.n_ctx if report.identity else 0,
                         "args": ["--cache-type-k", "q8_0"]}})
        restored = await files.restore(address(server), manifest, MODEL, 1000.0, DAY)
    assert report.saved == () and [s.slot for s in report.skipped] == [1, 0]
    assert all("501" in s.reason and "--slot-save-path" in s.reason for s in report.skipped)
    assert status_value(report, now=1000.0) is None, "nothing saved: no manifest"
    [refused] = restored.skipped
    assert refused.slot == 0 and "501" in refused.reason


async def test_a_save_of_a_slot_that_nothing_answers_is_reported(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    async with fake(tmp_path, tmp_path) as server:
        where = address(server)
    report = await SlotFiles(http).save(where, MEMBER, UID, KV, MODEL, time.monotonic)
    assert report.saved == () and report.identity is None
    assert report.error is not None and "/slots" in report.error


async def test_a_busy_slot_delays_its_save_until_its_generation_ends(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    async with fake(tmp_path, tmp_path, "--tokens-per-second", "40") as server:
        generation = asyncio.create_task(complete(http, server.base_url, FIRST, 0, 40))
        await processing(http, server.base_url, 0)
        report = await SlotFiles(http).save(address(server), MEMBER, UID, KV, MODEL,
                                            time.monotonic)
        assert generation.done(), "the save answered before the generation ended"
        answer = await generation
    # The file holds the whole generation, written once it ended.
    assert [(s.slot, s.tokens) for s in report.saved] == [(0, answer["usage"]["total_tokens"])]


async def test_a_save_still_waiting_for_a_busy_slot_at_the_time_cap_is_cut_and_reported(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    capped = dataclasses.replace(KV, save_timeout=0.5)
    async with fake(tmp_path, tmp_path, "--tokens-per-second", "20") as server:
        await complete(http, server.base_url, SECOND, 1)
        generation = asyncio.create_task(complete(http, server.base_url, FIRST, 0, 60))
        await processing(http, server.base_url, 0)
        report = await SlotFiles(http).save(address(server), MEMBER, UID, capped, MODEL,
                                            time.monotonic)
        assert not generation.done(), "the generation ended before the cap"
        await generation
    # Slot 0 ran last: it is tried first, waits out the cap, and slot 1 is not started.
    assert report.saved == ()
    assert report.skipped == (Skipped(0, "time cap"), Skipped(1, "time cap"))
    assert capped.save_timeout <= report.seconds < 2.0
