"""A vLLM member's share of a device it shares with other members of a budgeted pool.

vLLM sizes itself by `--gpu-memory-utilization`, the fraction of the device's whole memory
this instance may take (0.92 by default in current releases, 0.9 before): at start it
checks that the memory free on the device is at least that fraction of the total
(`request_memory` in vllm/v1/worker/utils.py), and refuses to start otherwise; the
fraction then bounds this instance alone, whatever else runs on the device. A member of a
budgeted pool is given its footprint over the device's memory, rounded down, so what it
asks for never passes its footprint, and the budget keeps that much free for it. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

FLAG = "--gpu-memory-utilization"
_SPELLINGS = (FLAG, "--gpu_memory_utilization")
_STEPS = 10_000  # four decimals


def sets_utilization(args: Sequence[str]) -> bool:
    """Whether a member's own args already set the fraction (theirs is kept)."""
    return any(a == s or a.startswith(f"{s}=") for a in args for s in _SPELLINGS)


def utilization(footprint: int, device_memory: int) -> str:
    """`footprint` over `device_memory`, rounded down to four decimals, within vLLM's
    range (more than 0, at most 1)."""
    if device_memory <= 0:
        raise ValueError("device_memory must be positive")
    steps = max(1, min(_STEPS, footprint * _STEPS // device_memory))
    return f"{steps / _STEPS:.4f}"


def utilization_args(args: Sequence[str], footprint: int | None,
                     device_memory: int | None) -> tuple[str, ...]:
    """The args a vLLM member gets before its own: the flag and its share, unless its args
    set one or its share is not known."""
    if footprint is None or device_memory is None or sets_utilization(args):
        return ()
    return (FLAG, utilization(footprint, device_memory))
