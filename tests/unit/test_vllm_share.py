"""A vLLM member's `--gpu-memory-utilization` in a budgeted pool (`reconciler.vllm_share`):
its footprint over the device's memory, rounded down, unless its args set one."""

from __future__ import annotations

import math

import pytest

from reconciler import vllm_share

pytestmark = pytest.mark.unit

GIB = 1 << 30


@pytest.mark.parametrize(("footprint", "memory", "share"), [
    (8 * GIB, 16 * GIB, "0.5000"),
    (10 * GIB, 24 * GIB, "0.4166"),  # 0.41666...: down, never past the footprint
    (16 * GIB, 16 * GIB, "1.0000"),
    (1, 80 * GIB, "0.0001"),  # vLLM takes no 0
    (20 * GIB, 16 * GIB, "1.0000"),  # nor more than 1
])
def test_the_share_is_the_footprint_over_the_memory_rounded_down(
    footprint: int, memory: int, share: str
) -> None:
    assert vllm_share.utilization(footprint, memory) == share
    # what vLLM then asks for at start (ceil(total x fraction)) is within the footprint,
    # where the footprint is at least the smallest share
    if footprint <= memory and footprint * 10_000 >= memory:
        assert math.ceil(memory * float(share)) <= footprint


@pytest.mark.parametrize(("args", "sets"), [
    ((), False),
    (("--max-model-len", "4096"), False),
    (("--gpu-memory-utilization", "0.3"), True),
    (("--gpu-memory-utilization=0.3",), True),
    (("--gpu_memory_utilization", "0.3"), True),
    (("--gpu-memory-utilization-x",), False),
])
def test_a_members_own_fraction_is_kept(args: tuple[str, ...], sets: bool) -> None:
    assert vllm_share.sets_utilization(args) is sets
    assert (vllm_share.utilization_args(args, 8 * GIB, 16 * GIB) == ()) is sets


def test_no_flag_while_the_footprint_or_the_memory_is_unknown() -> None:
    assert vllm_share.utilization_args((), None, 16 * GIB) == ()
    assert vllm_share.utilization_args((), 8 * GIB, None) == ()
    assert vllm_share.utilization_args((), 8 * GIB, 16 * GIB) == (
        "--gpu-memory-utilization", "0.5000")
