"""The GPU script's pure parts: the footprint a member declares, nvidia-smi's CSV read back,
the table of results, the profiles, and the generated models' sizes against their names."""

from __future__ import annotations

import pytest

from benchmarks.gpu import table
from benchmarks.gpu.footprint import MIB, Shape, footprint_bytes, kv_cache_bytes
from benchmarks.gpu.memory import parse_cards, parse_compute_apps, parse_rss_mib
from benchmarks.gpu.profiles import PROFILES
from benchmarks.gpu.steps import prompt_tokens
from e2e.llama import models

pytestmark = pytest.mark.unit


def test_the_kv_cache_is_keys_and_values_of_every_layer_and_cell_in_f16() -> None:
    shape = Shape(layers=8, kv_heads=16, head_dim=128)
    # 2 (K and V) * 8 layers * 4096 cells * 16 heads * 128 * 2 bytes
    assert kv_cache_bytes(shape, 4096) == 2 * 8 * 4096 * 16 * 128 * 2 == 256 * MIB


def test_the_context_is_rounded_up_to_whole_blocks_of_256_cells() -> None:
    shape = Shape(layers=1, kv_heads=1, head_dim=1)
    assert kv_cache_bytes(shape, 1) == kv_cache_bytes(shape, 256) == 2 * 256 * 2
    assert kv_cache_bytes(shape, 257) == 2 * 512 * 2


def test_a_footprint_is_the_file_and_the_kv_cache_at_the_served_context() -> None:
    shape = Shape(layers=18, kv_heads=32, head_dim=128)
    assert footprint_bytes(20_000_000_000, shape, 4096) == 20_000_000_000 + 1152 * MIB


SMI_APPS = """\
4242, 2710
4243, 8870
4244, [N/A]
"""


def test_compute_apps_give_mib_per_process_and_none_where_the_driver_cannot_say() -> None:
    assert parse_compute_apps(SMI_APPS) == {4242: 2710, 4243: 8870, 4244: None}


def test_no_compute_apps_is_an_empty_listing_whatever_nvidia_smi_prints() -> None:
    assert parse_compute_apps("") == {}
    assert parse_compute_apps("No running processes found\n") == {}


def test_a_card_line_gives_its_name_driver_memory_and_architecture() -> None:
    (card,) = parse_cards("NVIDIA H100 80GB HBM3, 580.159.04, 81559, 0, 9.0\n")
    assert (card.name, card.driver, card.total_mib, card.used_mib) == (
        "NVIDIA H100 80GB HBM3", "580.159.04", 81559, 0)
    assert card.arch == "90"


def test_a_card_without_memory_figures_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="no memory figures"):
        parse_cards("NVIDIA H200, 580.159.03, [N/A], [N/A], 9.0\n")


def test_rss_is_read_in_mib_from_proc_status() -> None:
    status = "Name:\tllama-server\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert parse_rss_mib(status) == 100.0
    assert parse_rss_mib("Name:\tzombie\n") is None


def results() -> dict[str, object]:
    return {
        "profile": "gpu", "started": "2026-12-06T09:00:00Z", "build_s": 250.0,
        "host": {"cpus": 16},
        "device": {"probe": "nvidia-smi", "name": "NVIDIA H100 80GB HBM3",
                   "total_mib": 81559, "driver": "580.159.04", "compute_cap": "9.0"},
        "load": [{"model": "2gb", "bytes": 2_150_000_000, "cache": "cold",
                  "cold_method": "fadvise+drop_caches", "cached_before": 0.0, "ready_s": 2.5},
                 {"model": "2gb", "bytes": 2_150_000_000, "cache": "warm",
                  "cold_method": "-", "cached_before": 1.0, "ready_s": 1.25}],
        "swap": [{"from": "2gb", "to": "8gb", "exit_s": 0.3, "freed_s": 0.1, "ready_s": 4.0,
                  "total_s": 4.4, "answered": True}],
        "resident": [{"count": 2, "card_used_mib": 12_000.0, "card_baseline_mib": 500.0,
                      "members": [
                          {"model": "2gb", "context": 4096, "file_mib": 2050.0,
                           "kv_mib": 256.0, "declared_mib": 2306.0, "measured_mib": 2900.0,
                           "answered": True, "answer_s": 0.05},
                          {"model": "8gb", "context": 4096, "file_mib": 8200.0,
                           "kv_mib": 512.0, "declared_mib": 8712.0, "measured_mib": None,
                           "answered": False, "answer_s": 0.07}]}],
        "kv": [{"model": "2gb", "context": 32768, "restore_s": 0.4, "continue_s": 0.05,
                "n_restored": 32768, "continue_cache_n": 32768, "continue_prompt_n": 16,
                "reprefill_s": 3.2, "reprefill_prompt_n": 32784, "save_s": 0.9,
                "file_bytes": 2 * 1024**3}],
        "errors": [{"step": "kv", "error": "ServerError('a|b')"}],
    }


def test_the_table_has_a_row_per_figure_under_a_line_naming_the_card() -> None:
    text = table.render(results())
    lines = text.splitlines()
    assert lines[0] == ("Profile `gpu` on NVIDIA H100 80GB HBM3 (81,559 MiB, driver 580.159.04, "
                        "compute capability 9.0), 2026-12-06T09:00:00Z, llama-server built in "
                        "250 s.")
    assert lines[2:4] == ["| step | case | figure |", "| --- | --- | --- |"]
    rows = lines[4:]
    assert rows == [
        "| load to /health 200 | 2gb (2.15 GB), cold (fadvise+drop_caches; 0% cached before) "
        "| 2.50 s |",
        "| load to /health 200 | 2gb (2.15 GB), warm | 1.25 s |",
        "| swap | 2gb → 8gb | 4.40 s (exit 0.30 s, memory freed 0.10 s later, ready 4.00 s; "
        "answered) |",
        "| 2 resident | 2gb | measured 2,900 MiB, declared 2,306 MiB (file 2,050 MiB + KV 256 "
        "MiB at 4,096 tokens), +594 MiB over; answered in 0.05 s |",
        "| 2 resident | 8gb | measured n/a, declared 8,712 MiB (file 8,200 MiB + KV 512 MiB at "
        "4,096 tokens); NOT answered in 0.07 s |",
        "| 2 resident | the card, all of them | used 11,500 MiB over idle, declared 11,018 MiB |",
        "| KV restore vs re-prefill | 2gb, 32,768 tokens | restore 0.40 s + continue 0.05 s "
        "(n_restored 32,768, cache_n 32,768, prompt_n 16) vs re-prefill 3.20 s (prompt_n "
        "32,784); save 0.90 s, 2,048 MiB file |",
        "| error | kv | ServerError('a/b') |",
    ]


def test_a_cpu_run_names_its_cores_and_has_no_card_line() -> None:
    text = table.render({"profile": "cpu", "started": "t", "host": {"cpus": 2},
                         "device": {"probe": "proc-rss"}, "build_s": None,
                         "resident": [{"count": 2, "card_used_mib": None, "members": []}]})
    assert text.splitlines()[0] == "Profile `cpu` on CPUs only (2 cores), memory from /proc RSS, t."
    assert "the card" not in text


def test_the_kv_server_has_room_for_the_longest_prompt_and_its_continuation() -> None:
    for profile in PROFILES.values():
        assert profile.kv_server_context >= max(profile.kv_contexts) + 16 + 1
        assert profile.kv_size in profile.sizes


def approximate_bytes(size: str) -> int:
    """A model's float32 tensors: embeddings and output, and each layer's attention and
    feed-forward weights."""
    shape = models.SIZES[size]
    vocab = len(models.vocabulary()[0])
    e, f = shape.embedding, shape.feed_forward
    return 4 * (2 * vocab * e + shape.layers * (4 * e * e + 3 * e * f + 2 * e) + e)


@pytest.mark.parametrize("size", [s for p in PROFILES.values() for s in p.sizes])
def test_each_benchmark_model_is_about_the_size_it_is_named_for(size: str) -> None:
    named = int(size[:-2]) * (10**9 if size.endswith("gb") else 2**20)
    assert 0.85 * named <= approximate_bytes(size) <= 1.15 * named, approximate_bytes(size)


def test_prompts_are_ordinary_pieces_the_same_each_time_and_differ_by_offset() -> None:
    _, _, types = models.vocabulary()
    prompt = prompt_tokens(1000)
    assert len(prompt) == 1000 and prompt == prompt_tokens(1000)
    assert {types[t] for t in prompt} == {models.NORMAL}
    assert len(set(prompt)) > 50
    assert prompt_tokens(16, offset=1000) != prompt_tokens(16)
