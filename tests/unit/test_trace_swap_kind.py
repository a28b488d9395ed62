"""The kind swap tracer's reading of the GPU node's journal: which lines belong to which
member, containerd's lines that name a sandbox or container only by its id included."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def tracer() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("trace_swap_kind",
                                                  BENCHMARKS / "trace_swap_kind.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SANDBOX = "ab" * 32
CONTAINER = "cd" * 32


def test_lines_are_named_by_pod_and_by_the_ids_a_named_line_introduced() -> None:
    t = tracer()
    lines = [
        (100.0, "kubelet.service", 'I1202 "SyncLoop ADD" source="api" pods=["ns/b-7f-x"]'),
        (100.2, "containerd.service",
         f'RunPodSandbox for &PodSandboxMetadata{{Name:b-7f-x,}} returns sandbox id "{SANDBOX}"'),
        (100.3, "containerd.service",
         f'CreateContainer within sandbox "{SANDBOX}" returns container id "{CONTAINER}"'),
        (100.4, "containerd.service", f'StartContainer for "{CONTAINER}" returns successfully'),
        (100.5, "containerd.service", 'StartContainer for "' + "ef" * 32 + '" returns'),
        (100.6, "kubelet.service", '"SyncLoop DELETE" source="api" pods=["ns/a-9c-y"]'),
    ]
    stamps = t.journal_stamps(lines, {"b-7f-x": "b", "a-9c-y": "a"}, offset=99.0, raw=False)
    assert [(round(s.at, 1), s.what) for s in stamps] == [
        (1.0, "kubelet: pod added (b)"),
        (1.2, "containerd: RunPodSandbox (b)"),
        (1.3, "containerd: CreateContainer (b)"),
        (1.4, "containerd: StartContainer (b)"),
        (1.6, "kubelet: pod deletion seen (a)"),
    ]


def test_steal_is_the_share_of_the_eighth_counter_between_two_readings() -> None:
    t = tracer()
    before = [100, 0, 50, 800, 0, 0, 0, 50, 0, 0]
    after = [160, 0, 70, 840, 0, 0, 0, 130, 0, 0]  # 200 ticks passed, 80 of them stolen
    assert t.bench_swap_kind.steal_percent(before, after) == 40.0
