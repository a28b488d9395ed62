"""The fake model server takes the command lines that pods give llama-server and vLLM
(docs/contracts.md sections 3 and 4), parsed as a table of cases; the real process started
with each style of argv is tests/functional/test_fake_model_cli.py."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest

from e2e.fake_model.cli import main
from e2e.fake_model.settings import Mode, Settings, SettingsError, parse_settings

pytestmark = pytest.mark.unit

LLAMA_SERVER_ARGV = (
    "--mode", "llamacpp", "--model", "/models/qwen.gguf", "--host", "0.0.0.0",
    "--port", "18080", "-ngl", "99", "--ctx-size", "8192", "-md", "/models/draft.gguf",
    "--flash-attn", "--jinja",
)  # fmt: skip
VLLM_ARGV = (
    "--mode", "vllm", "serve", "/models/Qwen2.5-1.5B-Instruct", "--port", "8000",
    "--served-model-name", "qwen", "--gpu-memory-utilization", "0.90",
    "--max-model-len", "8192", "--enforce-eager",
)  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ((), {}, Settings()),
        (
            LLAMA_SERVER_ARGV,
            {},
            {"mode": Mode.LLAMACPP, "model_id": "/models/qwen.gguf", "host": "0.0.0.0",
             "port": 18080},
        ),
        (
            LLAMA_SERVER_ARGV,
            {"MODELPOOL_BIND_HOST": "127.0.3.4"},
            {"host": "127.0.3.4", "model_id": "/models/qwen.gguf"},
        ),
        (("-m", "/m/gemma.Q4_K_M.gguf", "-a", "gemma"), {}, {"model_id": "gemma"}),
        (("-m", "/m/gemma.gguf", "-np", "2"), {}, {"model_id": "gemma", "parallel": 2}),
        (VLLM_ARGV, {}, {"mode": Mode.VLLM, "model_id": "qwen", "port": 8000}),
        (("serve", "Qwen/Qwen2.5-0.5B", "--port", "8000"), {}, {"model_id": "Qwen2.5-0.5B"}),
        (("Qwen/Qwen2.5-0.5B", "--dtype", "auto"), {}, {"model_id": "Qwen2.5-0.5B"}),
        (("--mode", "vllm", "--model=/m/llama3", "--max-num-seqs", "8"), {},
         {"model_id": "llama3", "parallel": 8}),
        (
            (),
            {"FAKE_MODEL_LOAD_TIME": "2.5", "FAKE_MODEL_TOKENS_PER_SECOND": "7"},
            {"load_time": 2.5, "tokens_per_second": 7.0},
        ),
        (
            ("--load-time", "0", "--tokens-per-second", "100"),
            {"FAKE_MODEL_LOAD_TIME": "2.5", "FAKE_MODEL_TOKENS_PER_SECOND": "7"},
            {"load_time": 0.0, "tokens_per_second": 100.0},
        ),
        ((), {"FAKE_MODEL_FAIL_LOAD": "1", "FAKE_MODEL_UNLOAD_TIME": "4"},
         {"fail_load": True, "unload_time": 4.0}),
        (("--fail-load",), {}, {"fail_load": True}),
        (
            (),
            {"NVIDIA_VISIBLE_DEVICES": "0,2", "MODELPOOL_GPU_LOCK_DIR": "/run/gpu"},
            {"gpu_ids": ("0", "2"), "gpu_lock_dir": Path("/run/gpu")},
        ),
        ((), {"NVIDIA_VISIBLE_DEVICES": "void"}, {"gpu_ids": ()}),
        ((), {"NVIDIA_VISIBLE_DEVICES": "none"}, {"gpu_ids": ()}),
        ((), {"NVIDIA_VISIBLE_DEVICES": ""}, {"gpu_ids": ()}),
    ],
)  # fmt: skip
def test_parse_settings(
    argv: tuple[str, ...], env: dict[str, str], expected: Settings | dict[str, object]
) -> None:
    settings = parse_settings(argv, env)
    if isinstance(expected, Settings):
        assert settings == expected
    else:
        assert {key: getattr(settings, key) for key in expected} == expected


def test_unknown_flags_are_kept_for_the_log_but_not_the_model() -> None:
    settings = parse_settings(VLLM_ARGV, {})
    assert "--enforce-eager" in settings.ignored_args
    assert "serve" not in settings.ignored_args
    assert "/models/Qwen2.5-1.5B-Instruct" not in settings.ignored_args


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (("--tokens-per-second", "0"), {}),
        (("--parallel", "0"), {}),
        (("--mode", "tgi"), {}),
        ((), {"FAKE_MODEL_LOAD_TIME": "soon"}),
    ],
)
def test_bad_settings_are_errors(argv: tuple[str, ...], env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        parse_settings(argv, env)


def test_console_script_points_at_main() -> None:
    (script,) = importlib.metadata.entry_points(group="console_scripts",
                                                name="modelpool-fake-model")
    target = script.value
    module_name, _, attribute = target.partition(":")
    assert getattr(importlib.import_module(module_name), attribute) is main


def test_the_context_size_binds_only_in_llamacpp_mode() -> None:
    assert parse_settings(("--mode", "llamacpp", "-c", "2048"), {}).ctx_size == 2048
    assert parse_settings(("--mode", "llamacpp", "--ctx-size", "512"), {}).ctx_size == 512
    assert parse_settings(("--mode", "llamacpp",), {}).ctx_size is None
    assert parse_settings(("--mode", "vllm", "--ctx-size", "512"), {}).ctx_size is None
    with pytest.raises(SettingsError, match="--ctx-size must be at least 1"):
        parse_settings(("--mode", "llamacpp", "-c", "0"), {})
