"""A budgeted pool's footprints: the entry's before the ModelServer's, and the problems
that stall the pool (a member without one, one larger than the budget), by table; then
through the pool's reconcile, where such a pool is Stalled and nothing is scaled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reconciler.footprints import (
    FOOTPRINT_MISSING,
    FOOTPRINT_OVER_BUDGET,
    footprint_problem,
    footprints,
)
from reconciler.spec import ModelPoolSpec, ModelServerSpec
from reconciler.stores import POOL, Key
from tests.unit.test_swap_shell import NS, FakeKube, controller, pool_body

pytestmark = pytest.mark.unit

GI = 1024**3


def _pool(budget: str | None, *entries: dict[str, Any]) -> ModelPoolSpec:
    spec: dict[str, Any] = {"members": list(entries)}
    if budget is not None:
        spec["gpuMemory"] = budget
    return ModelPoolSpec.from_body({"kind": "ModelPool", "metadata": {"name": "p"},
                                    "spec": spec})


def _server(name: str, gpu_memory: str | None) -> ModelServerSpec:
    resources = {} if gpu_memory is None else {"gpuMemory": gpu_memory}
    return ModelServerSpec.from_body({
        "kind": "ModelServer", "metadata": {"name": name},
        "spec": {"image": "i", "model": "m", "resources": resources}})


# (id, budget, entries, the servers' own footprints, footprints, problem reason, words in it)
CASES: list[tuple[str, str | None, list[dict[str, Any]], dict[str, str | None],
                  dict[str, int | None], str | None, tuple[str, ...]]] = [
    ("exclusive pool: nothing is asked", None, [{"name": "a"}, {"name": "b"}],
     {"a": None, "b": None}, {"a": None, "b": None}, None, ()),
    ("every footprint on the entries", "48Gi",
     [{"name": "a", "gpuMemory": "8Gi"}, {"name": "b", "gpuMemory": "20Gi"}],
     {"a": None, "b": None}, {"a": 8 * GI, "b": 20 * GI}, None, ()),
    ("every footprint on the servers", "48Gi", [{"name": "a"}, {"name": "b"}],
     {"a": "8Gi", "b": "48Gi"}, {"a": 8 * GI, "b": 48 * GI}, None, ()),
    ("the entry before the server", "48Gi", [{"name": "a", "gpuMemory": "8Gi"}],
     {"a": "64Gi"}, {"a": 8 * GI}, None, ()),
    ("a member with none", "48Gi", [{"name": "a", "gpuMemory": "8Gi"}, {"name": "b"}],
     {"a": None, "b": None}, {"a": 8 * GI, "b": None}, FOOTPRINT_MISSING,
     ("spec.gpuMemory is 48Gi", "for b:", "spec.resources.gpuMemory")),
    ("two with none", "48Gi", [{"name": "a"}, {"name": "b"}],
     {"a": None, "b": None}, {"a": None, "b": None}, FOOTPRINT_MISSING, ("a, b",)),
    ("a server larger than the budget", "16Gi", [{"name": "a"}, {"name": "b"}],
     {"a": "8Gi", "b": "18G"}, {"a": 8 * GI, "b": 18 * 10**9}, FOOTPRINT_OVER_BUDGET,
     ("spec.gpuMemory (16Gi)", "b (18G)")),
]


@pytest.mark.parametrize(("budget", "entries", "own", "expected", "reason", "words"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_footprints_and_their_problems(
    budget: str | None, entries: list[dict[str, Any]], own: dict[str, str | None],
    expected: dict[str, int | None], reason: str | None, words: tuple[str, ...],
) -> None:
    pool = _pool(budget, *entries)
    servers = {name: _server(name, size) for name, size in own.items()}
    assert footprints(pool, servers) == expected
    problem = footprint_problem(pool, servers)
    assert (problem.reason if problem else None) == reason
    for word in words:
        assert problem is not None and word in problem.message, (word, problem)


def test_a_server_not_in_view_has_no_footprint() -> None:
    pool = _pool("48Gi", {"name": "a"})
    assert footprints(pool, {}) == {"a": None}
    problem = footprint_problem(pool, {})
    assert problem is not None and problem.reason == FOOTPRINT_MISSING


@pytest.mark.parametrize(("budget", "b_footprint", "reason"), [
    (None, None, None),  # an exclusive pool loads its default as ever
    ("48Gi", "20Gi", None),  # a valid budgeted pool does the same, for now
    ("48Gi", None, FOOTPRINT_MISSING),
    ("16Gi", "32Gi", FOOTPRINT_OVER_BUDGET),
])
async def test_a_pool_with_a_footprint_problem_is_stalled_and_scales_nothing(
    budget: str | None, b_footprint: str | None, reason: str | None
) -> None:
    kube = FakeKube()
    c = controller(kube)
    body = pool_body()
    if budget is not None:
        body["spec"]["gpuMemory"] = budget
        body["spec"]["members"][0]["gpuMemory"] = "8Gi"
    c.pools.cache[(NS, "slot")] = body
    if b_footprint is not None:
        c.servers.cache[(NS, "b")]["spec"]["resources"]["gpuMemory"] = b_footprint
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await asyncio.wait_for(asyncio.gather(*c.ctx.background.tasks), 5)
    written = c.pools.cache[(NS, "slot")]["status"]
    stalled = [x for x in written["conditions"] if x["type"] == "Stalled"]
    scaled = [call for call in kube.calls if call[:2] == ("apply", "Deployment")]
    if reason is None:
        assert [x["status"] for x in stalled] in ([], ["False"])
        assert scaled == [("apply", "Deployment", "a")]  # the default, loaded
    else:
        assert [(x["status"], x["reason"]) for x in stalled] == [("True", reason)]
        assert written["phase"] == "Degraded"
        assert scaled == []
        assert ("event", reason, "slot") in kube.calls

