"""The fake model server's settings, built once from its command line and environment.

The command line is whatever a pod gives ``llama-server`` or vLLM, so parsing must take the
flags we know and let every other flag pass. argparse's short-option bundling would read
llama-server's ``-md draft.gguf`` as ``-m d``, so the short aliases we honour (``-m``, ``-a``,
``-np``) are rewritten to their long names first and argparse only ever sees long options.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_MODEL_ID = "fake-model"
WEIGHT_EXTENSIONS = frozenset({".gguf", ".bin", ".safetensors", ".pt", ".pth", ".onnx", ".ggml"})
NO_DEVICES = frozenset({"", "void", "none"})

# Short flags that real servers accept, rewritten to the long names we parse.
SHORT_ALIASES = {"-m": "--model", "-a": "--alias", "-np": "--parallel", "-c": "--ctx-size"}


class Mode(enum.StrEnum):
    OPENAI = "openai"
    LLAMACPP = "llamacpp"
    VLLM = "vllm"


class SettingsError(ValueError):
    """A flag or environment variable has a value the server cannot use."""


@dataclass(frozen=True)
class Settings:
    mode: Mode = Mode.OPENAI
    host: str = "0.0.0.0"
    port: int = 8080
    model_id: str = DEFAULT_MODEL_ID
    load_time: float = 0.0
    tokens_per_second: float = 50.0
    max_tokens_default: int = 16
    parallel: int = 4
    # llama.cpp's --ctx-size: shared by the slots; a prompt that does not fit one slot's
    # share is refused. None: no limit (vLLM, or llama.cpp given no size).
    ctx_size: int | None = None
    fail_load: bool = False
    unload_time: float = 0.0
    gpu_ids: tuple[str, ...] = ()
    gpu_lock_dir: Path | None = None
    # A shared device (the fake device plugin's shared mode): its memory, and this server's
    # footprint charged to its ledger (e2e/fake_model/gpu_ledger.py). None: exclusive.
    gpu_memory: int | None = None
    gpu_footprint: int | None = None
    # llama.cpp's --slot-save-path: where slot actions save and restore (llamacpp mode).
    slot_save_path: Path | None = None
    ignored_args: tuple[str, ...] = ()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.fake_model",
        description="A fake OpenAI-compatible model server (llama.cpp and vLLM flavours).",
        allow_abbrev=False,
    )
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.OPENAI.value)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--model", default=None)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--alias", default=None)
    parser.add_argument("--load-time", type=float, default=None)
    parser.add_argument("--tokens-per-second", type=float, default=None)
    parser.add_argument("--max-tokens-default", type=int, default=16)
    parser.add_argument("--parallel", "--max-num-seqs", dest="parallel", type=int, default=4)
    parser.add_argument("--ctx-size", type=int, default=None)
    parser.add_argument("--fail-load", action="store_true", default=None)
    parser.add_argument("--unload-time", type=float, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--slot-save-path", default=None)
    return parser


def served_model_id(model: str | None) -> str:
    """The id a server reports for ``--model``: its basename without a weight-file
    extension (``/models/qwen.gguf`` -> ``qwen``; ``Qwen/Qwen2.5-0.5B`` -> ``Qwen2.5-0.5B``)."""
    if not model:
        return DEFAULT_MODEL_ID
    name = PurePosixPath(model.rstrip("/")).name or model
    suffix = PurePosixPath(name).suffix
    if suffix.lower() in WEIGHT_EXTENSIONS:
        name = name[: -len(suffix)]
    return name or DEFAULT_MODEL_ID


def _positional_model(leftover: Sequence[str]) -> str | None:
    """vLLM's positional model among the arguments argparse did not take: the one after
    ``serve``, else a leading one (``vllm serve`` as the image's entrypoint, the model as
    its first argument)."""
    if "serve" in leftover:
        after = list(leftover[leftover.index("serve") + 1 :])
        return after[0] if after and not after[0].startswith("-") else None
    if leftover and not leftover[0].startswith("-"):
        return leftover[0]
    return None


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError as e:
        raise SettingsError(f"{name}={raw!r} is not a number of seconds or tokens") from e


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def gpu_ids(visible_devices: str | None) -> tuple[str, ...]:
    """Device ids from ``NVIDIA_VISIBLE_DEVICES``; none when it is unset, empty, void or none."""
    if visible_devices is None or visible_devices.strip().lower() in NO_DEVICES:
        return ()
    return tuple(part.strip() for part in visible_devices.split(",") if part.strip())


def _env_bytes(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) == 0:
        raise SettingsError(f"{name}={raw!r} is not a positive number of bytes")
    return int(raw)


def _gpu_share(utilization: float | None, env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(the shared device's memory, this server's footprint) in bytes; (None, None) on an
    exclusive device. The footprint is ``MODELPOOL_GPU_FOOTPRINT``, else vLLM's
    ``--gpu-memory-utilization`` times the device's memory, as vLLM sizes itself."""
    capacity = _env_bytes(env, "MODELPOOL_GPU_MEMORY")
    footprint = _env_bytes(env, "MODELPOOL_GPU_FOOTPRINT")
    if utilization is not None and not 0 < utilization <= 1:
        raise SettingsError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    if capacity is None:
        return None, None
    if footprint is None and utilization is not None:
        footprint = int(utilization * capacity)
    if footprint is None:
        raise SettingsError("a shared GPU (MODELPOOL_GPU_MEMORY) needs this server's footprint: "
                            "MODELPOOL_GPU_FOOTPRINT or --gpu-memory-utilization")
    return capacity, footprint


def parse_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Flags win over environment variables, which win over the defaults."""
    rewritten = [SHORT_ALIASES.get(arg, arg) for arg in argv]
    try:
        args, unknown = _parser().parse_known_args(rewritten)
    except SystemExit as e:  # argparse reports bad values by exiting; keep that for --help
        if e.code == 0:
            raise
        raise SettingsError(f"bad command line: {' '.join(argv)}") from e

    positional_model = _positional_model(unknown)
    model = args.model or positional_model
    if args.served_model_name:
        model_id = args.served_model_name[0]
    elif args.alias:
        model_id = args.alias
    elif args.mode == Mode.LLAMACPP.value and model:
        # llama-server names its model by the path as given (in /v1/models and in every
        # reply), as tests/functional/test_llama_contract.py holds it to.
        model_id = model
    else:
        model_id = served_model_id(model)

    load_time = args.load_time
    if load_time is None:
        load_time = _env_float(env, "FAKE_MODEL_LOAD_TIME") or 0.0
    tokens_per_second = args.tokens_per_second
    if tokens_per_second is None:
        tokens_per_second = _env_float(env, "FAKE_MODEL_TOKENS_PER_SECOND") or 50.0
    unload_time = args.unload_time
    if unload_time is None:
        unload_time = _env_float(env, "FAKE_MODEL_UNLOAD_TIME") or 0.0
    if tokens_per_second <= 0:
        raise SettingsError(f"tokens per second must be positive, got {tokens_per_second}")
    if load_time < 0 or unload_time < 0:
        raise SettingsError("load and unload times cannot be negative")
    if args.parallel < 1:
        raise SettingsError(f"--parallel must be at least 1, got {args.parallel}")
    if args.ctx_size is not None and args.ctx_size < 1:
        raise SettingsError(f"--ctx-size must be at least 1, got {args.ctx_size}")

    gpu_memory, footprint = _gpu_share(args.gpu_memory_utilization, env)
    bind_host = env.get("MODELPOOL_BIND_HOST", "").strip()
    lock_dir = env.get("MODELPOOL_GPU_LOCK_DIR", "").strip()
    ignored = [arg for arg in unknown if arg not in {"serve", positional_model}]
    return Settings(
        mode=Mode(args.mode),
        host=bind_host or args.host or "0.0.0.0",
        port=args.port,
        model_id=model_id,
        load_time=load_time,
        tokens_per_second=tokens_per_second,
        max_tokens_default=args.max_tokens_default,
        parallel=args.parallel,
        ctx_size=args.ctx_size if args.mode == Mode.LLAMACPP.value else None,
        fail_load=bool(args.fail_load) or _env_flag(env, "FAKE_MODEL_FAIL_LOAD"),
        unload_time=unload_time,
        gpu_ids=gpu_ids(env.get("NVIDIA_VISIBLE_DEVICES")),
        gpu_lock_dir=Path(lock_dir) if lock_dir else None,
        gpu_memory=gpu_memory,
        gpu_footprint=footprint,
        slot_save_path=(Path(args.slot_save_path)
                        if args.slot_save_path and args.mode == Mode.LLAMACPP.value else None),
        ignored_args=tuple(ignored),
    )
