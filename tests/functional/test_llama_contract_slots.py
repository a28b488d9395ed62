"""The fake model server held to a real `llama-server` on its slots' KV caches, the ground
that keeping conversations across a swap stands on: with `--slot-save-path`, a slot saved
to a file, erased and restored serves the next request's shared prefix from its cache
(`timings.cache_n`, and `usage.prompt_tokens_details.cached_tokens`); without the restore
nothing is cached; the errors a bad action gets; a server started without the path
refuses slot actions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.functional.test_llama_contract import Server, started

pytestmark = [pytest.mark.functional, pytest.mark.build("llama-server")]

# Long enough that the prefix is most of the prompt; words the generated model knows.
CONTEXT = " ".join(["the pool shares one GPU between its members"] * 12)


@pytest.fixture(params=["fake", "real"])
async def saving(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[
        tuple[Server, Path]]:
    slots = tmp_path / "slots"
    slots.mkdir()
    # llama-server joins the path and the file name as strings: the path ends with "/".
    async with started(request.param, tmp_path, ["--slot-save-path", f"{slots}/"]) as server:
        yield server, slots


async def post(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body or {}) as r:
        return r.status, await r.json(content_type=None)


async def complete(server: Server, prompt: str) -> dict[str, Any]:
    status, body = await post(server.base_url + "/v1/completions",
                              {"prompt": prompt, "max_tokens": 2, "id_slot": 1})
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def test_a_restored_slot_serves_the_shared_prefix_from_its_cache(
        saving: tuple[Server, Path]) -> None:
    server, slots = saving
    first = await complete(server, CONTEXT)
    context_tokens = first["usage"]["prompt_tokens"]
    assert first["timings"]["cache_n"] == 0

    status, saved = await post(server.base_url + "/slots/1?action=save", {"filename": "m-1"})
    assert status == 200, saved
    assert saved["id_slot"] == 1 and saved["filename"] == "m-1"
    assert saved["n_saved"] >= context_tokens and saved["n_written"] > 0
    assert (slots / "m-1").stat().st_size == saved["n_written"]
    assert saved["timings"]["save_ms"] >= 0

    status, erased = await post(server.base_url + "/slots/1?action=erase")
    assert status == 200 and erased == {"id_slot": 1, "n_erased": saved["n_saved"]}
    cold = await complete(server, CONTEXT + " and one more turn")
    assert cold["timings"]["cache_n"] == 0, "an erased slot caches nothing"

    status, restored = await post(server.base_url + "/slots/1?action=restore",
                                  {"filename": "m-1"})
    assert status == 200, restored
    assert restored["n_restored"] == saved["n_saved"]
    assert restored["n_read"] == saved["n_written"]
    warm = await complete(server, CONTEXT + " and one more turn")
    timings = warm["timings"]
    # The whole earlier prompt comes from the restored cache; only the new words are read.
    assert timings["cache_n"] == context_tokens, timings
    assert timings["cache_n"] + timings["prompt_n"] == warm["usage"]["prompt_tokens"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == context_tokens


async def test_a_bad_slot_action_names_what_is_wrong(saving: tuple[Server, Path]) -> None:
    server, _ = saving
    status, body = await post(server.base_url + "/slots/0?action=restore",
                              {"filename": "never-saved"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("Unable to restore slot")
    status, body = await post(server.base_url + "/slots/0?action=save",
                              {"filename": "../escape"})
    assert (status, body["error"]["message"]) == (400, "Invalid filename")
    status, body = await post(server.base_url + "/slots/0?action=save", {})
    assert status == 400 and "filename" in body["error"]["message"]
    status, body = await post(server.base_url + "/slots/0?action=defrag",
                              {"filename": "x"})
    assert (status, body["error"]["message"]) == (400, "Invalid action")


@pytest.mark.parametrize("kind", ["fake", "real"])
async def test_without_a_save_path_slot_actions_are_not_supported(
        kind: str, tmp_path: Path) -> None:
    async with started(kind, tmp_path) as server:
        status, body = await post(server.base_url + "/slots/0?action=save", {"filename": "x"})
    assert status == 501 and body["error"]["type"] == "not_supported_error"
    assert "--slot-save-path" in body["error"]["message"]
