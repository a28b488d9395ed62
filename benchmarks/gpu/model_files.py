"""The generated models the GPU script loads (e2e/llama/models.py, one per size), written
to disk for good (`fsync`: a cold load can then drop their pages), and the shape of a
model's KV cache read from its GGUF metadata."""

from __future__ import annotations

import os
from pathlib import Path

import gguf

from benchmarks.gpu.footprint import Shape
from e2e.llama import models

NAME = "bench"


def write(directory: Path, size: str) -> Path:
    path = models.write_model(directory, NAME, size)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _field(reader: gguf.GGUFReader, key: str) -> object:
    field = reader.fields.get(key)
    if field is None:
        raise KeyError(f"{key} is not in the GGUF metadata")
    value: object = field.contents()
    return value


def _int(reader: gguf.GGUFReader, key: str) -> int:
    value = _field(reader, key)
    if not isinstance(value, int):
        raise TypeError(f"{key} is {value!r}, not an integer")
    return value


def shape(path: Path) -> Shape:
    """Layers, KV heads and head size, as llama.cpp reads them (KV heads default to the
    attention heads)."""
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    heads = _int(reader, f"{arch}.attention.head_count")
    kv_key = f"{arch}.attention.head_count_kv"
    kv_heads = _int(reader, kv_key) if kv_key in reader.fields else heads
    return Shape(layers=_int(reader, f"{arch}.block_count"), kv_heads=kv_heads,
                 head_dim=_int(reader, f"{arch}.embedding_length") // heads)
