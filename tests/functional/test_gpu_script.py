"""The GPU script's dry run (`benchmarks/gpu/run.sh --cpu`): every step of the real run on
the CPU build of llama-server the suite already has (e2e/llama/build-llama-server.sh; this
test never builds it), with models of tens of megabytes, held to figures that are all there,
positive and plausible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu.footprint import MIB
from benchmarks.gpu.profiles import PROFILES
from e2e.local.paths import REPO_ROOT
from tests.functional.test_llama_contract import llama_server_binary

pytestmark = pytest.mark.functional
needs_llama_server = pytest.mark.build("llama-server")

RUN = REPO_ROOT / "benchmarks" / "gpu" / "run.sh"
PROFILE = PROFILES["cpu"]
CONTINUATION = 16
DRY_RUN_BUDGET_S = 100


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, float]:
    tmp = tmp_path_factory.mktemp("gpu-dry-run")
    start = time.monotonic()
    result = subprocess.run(
        ["bash", str(RUN), "--cpu", "--out", str(tmp / "out"), "--work", str(tmp / "work"),
         "--binary", str(llama_server_binary())],
        capture_output=True, text=True, timeout=DRY_RUN_BUDGET_S, check=False,
        env={**os.environ, "PYTHON": sys.executable})
    elapsed = time.monotonic() - start
    shutil.rmtree(tmp / "work")  # the models: a hundred megabytes
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp / "out" / "results.json").read_text())
    return results, (tmp / "out" / "table.md").read_text(), elapsed


@needs_llama_server
def test_the_dry_run_measures_every_step_without_an_error(
        dry_run: tuple[dict[str, Any], str, float]) -> None:
    results, _, elapsed = dry_run
    assert results["errors"] == []
    assert results["profile"] == "cpu" and results["device"] == {"probe": "proc-rss"}
    assert elapsed < DRY_RUN_BUDGET_S
    sizes = [m["size"] for m in results["models"]]
    assert sizes == list(PROFILE.sizes)
    assert [m["bytes"] for m in results["models"]] == sorted(m["bytes"] for m in
                                                              results["models"])
    assert all(10 * MIB < m["bytes"] < 100 * MIB for m in results["models"])


@needs_llama_server
def test_each_model_loads_from_a_cold_cache_then_a_warm_one(
        dry_run: tuple[dict[str, Any], str, float]) -> None:
    loads = dry_run[0]["load"]
    assert [(r["model"], r["cache"]) for r in loads] == [
        (size, cache) for size in PROFILE.sizes for cache in ("cold", "warm")]
    for r in loads:
        assert 0 < r["ready_s"] < 30, r
        if r["cache"] == "cold":
            assert r["cold_method"] == "fadvise"
            # util-linux's fincore says how much of the file was cached; none, if cold
            assert r["cached_before"] is None or r["cached_before"] < 0.05, r


@needs_llama_server
def test_a_swap_is_exit_then_memory_freed_then_ready_and_answering(
        dry_run: tuple[dict[str, Any], str, float]) -> None:
    swaps = dry_run[0]["swap"]
    small, middle, large = PROFILE.sizes
    assert [(r["from"], r["to"]) for r in swaps] == [
        (small, middle), (middle, large), (large, small)]
    for r in swaps:
        assert r["answered"], r
        assert r["exit_s"] >= 0 and r["freed_s"] >= 0 and r["ready_s"] > 0, r
        assert r["exit_s"] + r["freed_s"] + r["ready_s"] <= r["total_s"] < 30, r


@needs_llama_server
def test_two_then_three_servers_are_resident_and_answer_with_their_memory_read(
        dry_run: tuple[dict[str, Any], str, float]) -> None:
    resident = dry_run[0]["resident"]
    assert [r["count"] for r in resident] == [2, 3]
    for r in resident:
        assert [m["model"] for m in r["members"]] == list(PROFILE.sizes[:r["count"]])
        assert len({m["pid"] for m in r["members"]}) == r["count"]
        for m in r["members"]:
            assert m["answered"] and 0 < m["answer_s"] < 30, m
            assert m["kv_mib"] > 0 and m["declared_mib"] == pytest.approx(
                m["file_mib"] + m["kv_mib"]), m
            # the weights are mapped and touched by the warm-up, so most of them are resident
            assert 0.5 * m["file_mib"] < m["measured_mib"] < m["declared_mib"] + 500, m


@needs_llama_server
def test_a_restored_slot_is_continued_from_its_cache_and_a_re_prefill_is_not(
        dry_run: tuple[dict[str, Any], str, float]) -> None:
    kv = dry_run[0]["kv"]
    assert [r["context"] for r in kv] == list(PROFILE.kv_contexts)
    for r in kv:
        context = r["context"]
        assert context <= r["prefill_prompt_n"] <= context + 1, r
        assert r["n_saved"] >= context and r["n_restored"] == r["n_saved"], r
        # keys and values of one layer of 8 heads of 64 in f16: 2 KiB per token
        assert r["file_bytes"] >= 2 * 8 * 64 * 2 * context, r
        assert context - 1 <= r["continue_cache_n"] <= context + 1, r
        assert 0 < r["continue_prompt_n"] <= CONTINUATION + 1, r
        assert r["reprefill_cache_n"] == 0, r
        assert context + CONTINUATION <= r["reprefill_prompt_n"] <= context + CONTINUATION + 1
        for key in ("prefill_s", "save_s", "restore_s", "continue_s", "reprefill_s"):
            assert 0 < r[key] < 30, (key, r)


@needs_llama_server
def test_the_table_has_a_row_for_every_figure_and_none_missing(
        dry_run: tuple[dict[str, Any], str, float]) -> None:
    _, text, _ = dry_run
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    steps = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert steps == (["load to /health 200"] * 6 + ["swap"] * 3 + ["2 resident"] * 2
                     + ["3 resident"] * 3 + ["KV restore vs re-prefill"] * 3), text
    assert "n/a" not in text and "NOT answered" not in text


def test_a_step_that_fails_is_recorded_and_the_next_steps_still_run(tmp_path: Path) -> None:
    """A server that exits before it is ready (here `false`): each step's error goes to the
    results and the table, the steps after it run, and the command fails."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.measure", "run", "--profile", "cpu",
         "--binary", "/bin/false", "--work", str(tmp_path / "work"), "--out",
         str(tmp_path / "out"), "--steps", "swap,kv"],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO_ROOT)
    shutil.rmtree(tmp_path / "work")
    assert result.returncode == 1, result.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [e["step"] for e in results["errors"]] == ["swap", "kv"]
    assert all("exited 1 before it was ready" in e["error"] for e in results["errors"])
    assert results["swap"] == [] and results["kv"] == []
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| error | swap | ServerError(" in table and "| error | kv | ServerError(" in table
