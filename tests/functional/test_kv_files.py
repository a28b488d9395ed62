"""`modelpool-kv-files` (reconciler/kv_files.py), the container beside a persisted member's
llama-server, run as its own process on a directory standing in for the claim, and asked
by the reconciler's adapter (`SlotFiles.prune`): it removes the slot files of every owner
not kept and nothing else, and answers a body of another shape with a 400 that says what
is wrong."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from reconciler.kv_slots_io import SlotFiles

pytestmark = pytest.mark.functional

GEMMA = "gemma-5f0c2a1e"  # owner: member and the first part of its UID
QWEN = "qwen-2-7b-0a1b2c3d"  # a member's name may hold dashes
GONE = "old-9e8d7c6b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def claim(tmp_path: Path) -> Path:
    directory = tmp_path / "claim"
    directory.mkdir()
    for name in (f"{GEMMA}-11112222-slot0.bin", f"{GEMMA}-11112222-slot1.bin",
                 f"{QWEN}-33334444-slot0.bin", f"{GONE}-55556666-slot3.bin",
                 "lost+found.txt", "notes-slot0.bin"):
        (directory / name).write_bytes(b"x" * 16)
    return directory


@pytest.fixture
def server(claim: Path, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    log = (tmp_path / "kv-files.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "reconciler.kv_files", "--dir", str(claim), "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env={"MODELPOOL_BIND_HOST": "127.0.0.1"})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, (tmp_path / "kv-files.log").read_text()
                assert time.monotonic() < deadline, "kv-files did not listen within 30 s"
                time.sleep(0.05)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        assert process.wait(10) == 0  # SIGTERM: a clean stop
        log.close()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_only_the_slot_files_of_owners_not_kept_are_removed(
    server: tuple[str, int], claim: Path, http: aiohttp.ClientSession
) -> None:
    report = await SlotFiles(http).prune(server, [QWEN])
    assert report.error is None and report.failed == ()
    assert sorted(report.removed) == [f"{GEMMA}-11112222-slot0.bin",
                                      f"{GEMMA}-11112222-slot1.bin",
                                      f"{GONE}-55556666-slot3.bin"]
    assert listing(claim) == [
        "lost+found.txt", "notes-slot0.bin", f"{QWEN}-33334444-slot0.bin"]
    again = await SlotFiles(http).prune(server, [QWEN])
    assert again.removed == () and again.error is None


async def test_every_owner_kept_removes_nothing(
    server: tuple[str, int], claim: Path, http: aiohttp.ClientSession
) -> None:
    before = listing(claim)
    report = await SlotFiles(http).prune(server, [GEMMA, QWEN, GONE])
    assert report.removed == () and report.error is None
    assert listing(claim) == before


@pytest.mark.parametrize(("body", "says"), [
    (b"not json", "the body is not JSON"),
    (b'["gemma-5f0c2a1e"]', "keep: expected a list"),
    (b'{"keep": "gemma-5f0c2a1e"}', "keep: expected a list"),
    (b'{"keep": [1, 2]}', "keep: expected a list"),
    (b'{}', "keep: expected a list"),
])
async def test_a_body_of_another_shape_is_a_400_that_says_what_is_wrong(
    server: tuple[str, int], claim: Path, http: aiohttp.ClientSession, body: bytes, says: str
) -> None:
    before = listing(claim)
    host, port = server
    async with http.post(f"http://{host}:{port}/prune", data=body) as response:
        assert response.status == 400
        assert says in (await response.json())["error"]
    assert listing(claim) == before


async def test_a_container_that_cannot_be_reached_is_reported_not_raised(
    http: aiohttp.ClientSession,
) -> None:
    report = await SlotFiles(http, timeout=1.0).prune(("127.0.0.1", free_port()), [GEMMA])
    assert report.error is not None and "ClientConnectorError" in report.error
    assert report.removed == ()
