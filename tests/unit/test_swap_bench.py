"""The swap benchmark's verdict on its goal: p50 and p95 of the overhead, per kind of swap,
each said met or missed (docs/benchmarks.md states it from this, not by hand)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_swap.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_swap", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_swap", module)
    spec.loader.exec_module(module)
    return module


def test_the_goal_is_judged_on_p50_and_p95_of_each_kind() -> None:
    b = bench()
    warm = [b.Sample("warm", "w1", 2.5 + overhead, 2.5)
            for overhead in [0.3] * 18 + [0.6, 0.7]]
    cold = [b.Sample("cold", "c00", 2.2, 2.0)] * 20
    assert b.goal_verdicts(warm + cold) == [
        "warm: p50 0.30 s (met), p95 0.60 s (missed)",
        "cold: p50 0.20 s (met), p95 0.20 s (met)",
    ]


def test_the_readiness_period_it_explains_is_the_one_the_template_renders() -> None:
    from reconciler.render import Renderer
    from reconciler.spec import ModelServerSpec

    body = {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelServer",
            "metadata": {"namespace": "ns", "name": "w0", "uid": "u", "generation": 1},
            "spec": {"image": "modelpool/fake-model:e2e", "model": "/models/w0.gguf"}}
    objects = Renderer().model_server(ModelServerSpec.from_body(body), replicas=1,
                                      owner_uid="u")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["periodSeconds"] == bench().READINESS_PERIOD


def test_samples_that_waited_a_readiness_period_are_counted_apart() -> None:
    b = bench()
    samples = [b.Sample("warm", "w1", 2.5 + o, 2.5) for o in [0.3] * 18 + [2.3, 2.4]]
    text = b.report(samples, {}, b.Options(Path("/x"), 20, 0, 2.0, 0.5, False, False),
                    "cmd", (1.0, 1.0))
    assert ("Samples that waited that extra period: warm 2, cold 0; without them, warm: "
            "p50 0.30 s (met), p95 0.30 s (met).") in text
    assert text.rstrip().endswith("warm: p50 0.30 s (met), p95 2.30 s (missed).")
