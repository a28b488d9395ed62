"""The GPU memory a member of a memory-budget pool declares for a llama-server: its weights
(the GGUF file's size, which bounds the tensors' bytes from above) and its KV cache at the
context it serves.

The KV cache holds, for every layer and every position of the context, one key and one
value vector of `kv_heads * head_dim` elements, f16 by default (2 bytes): 2 * layers *
context * kv_heads * head_dim * 2 bytes. llama.cpp rounds the context up to a multiple of
256 cells. What the declaration leaves out (the CUDA context, the compute buffers) is the
difference the GPU script reports between a process's measured memory and this figure.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
KV_PAD = 256  # llama.cpp's KV cache cells come in multiples of this
F16_BYTES = 2


@dataclass(frozen=True)
class Shape:
    """What a model's KV cache depends on, from its GGUF metadata."""

    layers: int
    kv_heads: int
    head_dim: int


def padded_context(context: int) -> int:
    return -(-context // KV_PAD) * KV_PAD


def kv_cache_bytes(shape: Shape, context: int, element_bytes: int = F16_BYTES) -> int:
    """Keys and values for every layer and every cell of the (padded) context."""
    return 2 * shape.layers * padded_context(context) * shape.kv_heads * shape.head_dim \
        * element_bytes


def footprint_bytes(file_bytes: int, shape: Shape, context: int) -> int:
    """What a member declares: weights plus KV cache."""
    return file_bytes + kv_cache_bytes(shape, context)


def mib(n_bytes: int) -> float:
    return n_bytes / MIB
