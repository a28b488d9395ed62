"""The pure parts of `modelpool-local demo` (e2e/local/demo.py): what it reads from the
examples, how it narrates a pool's status, how it reads Prometheus text."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.local import cli, demo

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _examples() -> list[dict[str, Any]]:
    """examples/ as kustomize renders it: the kustomization's namespace on every object."""
    kustomization = yaml.safe_load((REPO / "examples" / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((REPO / "examples" / name).read_text()):
            if doc and doc["kind"] != "Namespace":
                doc["metadata"]["namespace"] = kustomization["namespace"]
                docs.append(doc)
    return docs


def test_the_examples_name_one_pool_and_one_router() -> None:
    example = demo.example_names(_examples())
    assert example.default in example.members
    assert len(example.members) >= 2
    assert example.namespace and example.pool and example.router


def test_examples_without_a_router_are_refused() -> None:
    docs = [d for d in _examples() if d["kind"] != "ModelRouter"]
    with pytest.raises(demo.DemoError, match="one ModelRouter"):
        demo.example_names(docs)


def _pool(**status: Any) -> dict[str, Any]:
    return {"status": status}


@pytest.mark.parametrize(
    ("old", "new", "lasted", "expected"),
    [
        (_pool(phase="Ready", residentMember="a"),
         _pool(phase="Ready", residentMember="a", request={"member": "b", "generation": 3}),
         None, ["a router asks for b (request #3)"]),
        (_pool(phase="Ready", residentMember="a"),
         _pool(phase="Swapping", residentMember="a",
               swap={"from": "a", "to": "b", "phase": "Draining"}),
         None, ["swap a -> b: Draining", "phase Swapping, resident a"]),
        (_pool(phase="Swapping", residentMember="a",
               swap={"from": "a", "to": "b", "phase": "Draining"}),
         _pool(phase="Swapping", residentMember="a",
               swap={"from": "a", "to": "b", "phase": "Unloading"}),
         0.5, ["swap a -> b: Unloading (Draining took 0.50s)"]),
        (_pool(phase="Swapping", swap={"from": None, "to": "b", "phase": "Loading"}),
         _pool(phase="Ready", residentMember="b",
               lastSwap={"to": "b", "outcome": "Succeeded", "durationSeconds": 2.0}),
         2.0, ["swap (none) -> b ended (Loading took 2.00s)", "phase Ready, resident b",
               "lastSwap (none) -> b: Succeeded in 2.00s"]),
        (_pool(phase="Ready", residentMember="a"),
         _pool(phase="Ready", residentMember="a",
               lastSwap={"from": "a", "to": "b", "outcome": "Abandoned", "durationSeconds": 30,
                         "reason": "SwapBudgetExceeded", "message": "b not Ready"}),
         None, ["lastSwap a -> b: Abandoned in 30.00s (SwapBudgetExceeded: b not Ready)"]),
    ],
)
def test_pool_changes_are_narrated(
    old: dict[str, Any], new: dict[str, Any], lasted: float | None, expected: list[str]
) -> None:
    lines = demo.describe_pool_change(demo.pool_view(old), demo.pool_view(new), lasted)
    assert lines == expected


METRICS = """\
# HELP modelpool_held_requests Requests held
# TYPE modelpool_held_requests gauge
modelpool_held_requests{member="a",pool="p",router="r"} 3.0
modelpool_held_requests{member="b",pool="p",router="r"} 0.0
# HELP modelpool_swap_phase_duration_seconds Phase
# TYPE modelpool_swap_phase_duration_seconds histogram
modelpool_swap_phase_duration_seconds_sum{namespace="n",phase="unload",pool="p"} 1.5
modelpool_swap_phase_duration_seconds_count{namespace="n",phase="unload",pool="p"} 2.0
modelpool_swap_phase_duration_seconds_sum{namespace="other",phase="unload",pool="p"} 9.0
# HELP modelpool_coalesced Coalesced
# TYPE modelpool_coalesced counter
modelpool_coalesced_total{member="a",pool="p",router="r"} 4.0
modelpool_coalesced_total{member="b",pool="p",router="r"} 1.0
"""


def test_metrics_are_read_by_label() -> None:
    assert demo.held_by_member(METRICS) == {"a": 3, "b": 0}
    assert demo.phase_seconds(METRICS, "n", "p") == {"unload": 1.5}
    assert demo.counter_total(METRICS, "modelpool_coalesced_total") == 5.0


def test_the_timeline_stamps_each_line() -> None:
    out = io.StringIO()
    ticks = iter([10.0, 12.5])
    timeline = demo.Timeline(out, clock=lambda: next(ticks))
    timeline.say("pool", "phase Ready")
    assert "+  2.50s  pool      phase Ready" in out.getvalue()


def test_the_cli_offers_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--help"])
    assert exit_.value.code == 0
    assert "--state-dir" in capsys.readouterr().out


def test_a_pool_that_says_its_member_is_unschedulable_is_narrated_once() -> None:
    why = "gemma cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    body = {"status": {"phase": "Swapping", "conditions": [
        {"type": "Ready", "status": "False", "reason": "Unschedulable", "message": why},
    ]}}
    view = demo.pool_view(body)
    assert view.unschedulable == why
    assert f"Unschedulable: {why}" in demo.describe_pool_change(demo.PoolView(), view, None)
    assert demo.describe_pool_change(view, view, None) == []
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Resident"}]}}
    assert demo.pool_view(ready).unschedulable is None
