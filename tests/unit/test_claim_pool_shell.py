"""A claim pool through the pool's reconcile (`reconciler.pools`, `reconciler.controller`)
over a fake of our own `Kube` port: where the API server serves no `resource.k8s.io/v1` a
claim pool is Stalled and nothing is scaled; where it does, the pool's ResourceClaim is
applied before any member, the budget follows the allocated device's memory, and the
watches of claims and devices wake the pools they concern."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from reconciler import residency as r
from reconciler.controller import Controller
from reconciler.kube import RESOURCE_SLICES, KubeError, Resource
from reconciler.metrics import ReconcilerMetrics
from reconciler.render import Renderer
from reconciler.settings import Settings
from reconciler.stores import POOL, Key
from tests.unit.test_swap_shell import (
    NOW,
    NS,
    FakeKube,
    FakeProbe,
    index,
    pool_body,
    queued,
    router_body,
    server,
)

pytestmark = pytest.mark.unit

GIB = 1 << 30
DRIVER = "gpu.fake.modelpool.dev"


def claim_controller(kube: FakeKube, served: bool, refused: str | None = None,
                     **spec: Any) -> Controller:
    c = Controller(kube, Settings(namespace=NS), ReconcilerMetrics(CollectorRegistry()),
                   Renderer(), FakeProbe(kube), clock=lambda: NOW, claims_served=served,
                   claims_refused=refused)
    for name in ("a", "b"):
        c.servers.cache[(NS, name)] = server(name)
    body = pool_body()
    body["spec"]["device"] = {"claim": {"deviceClassName": DRIVER}}
    body["spec"].update(spec)
    for entry in body["spec"]["members"]:
        entry["gpuMemory"] = "8Gi"
    c.pools.cache[(NS, "slot")] = body
    c.routers.cache[(NS, "chat")] = router_body()
    return c


def allocate(c: Controller, memory: str | None) -> None:
    """The scheduler allocated the pool's claim a device whose driver publishes `memory`."""
    assert c.ctx.stores.claims is not None and c.ctx.stores.slices is not None
    c.ctx.stores.claims.cache[(NS, "slot-gpu")] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": NS, "name": "slot-gpu", "resourceVersion": "5",
                     "labels": {"modelpool.dev/pool": "slot"}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node", "device": "gpu-0"}]}}}}
    capacity = {} if memory is None else {"memory": {"value": memory}}
    c.ctx.stores.slices.cache[("", "node-slice")] = {
        "metadata": {"name": "node-slice"},
        "spec": {"driver": DRIVER, "pool": {"name": "node", "generation": 1},
                 "devices": [{"name": "gpu-0", "capacity": capacity}]}}


async def reconcile(c: Controller) -> dict[str, Any]:
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await asyncio.wait_for(asyncio.gather(*c.ctx.background.tasks), 5)
    status: dict[str, Any] = c.pools.cache[(NS, "slot")]["status"]
    return status


def stalled(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(x["status"], x["reason"]) for x in status["conditions"]
            if x["type"] == "Stalled"]


async def test_without_the_api_a_claim_pool_is_stalled_and_nothing_is_scaled() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=False)
    assert c.ctx.stores.claims is None  # nothing of resource.k8s.io is watched
    status = await reconcile(c)
    assert stalled(status) == [("True", "DeviceClaimUnsupported")]
    assert status["phase"] == "Degraded"
    assert [call for call in kube.calls if call[0] in ("apply", "delete")] == []
    assert ("event", "DeviceClaimUnsupported", "slot") in kube.calls
    (c_,) = [x for x in status["conditions"] if x["type"] == "Stalled"]
    assert "resource.k8s.io/v1" in c_["message"], c_


async def test_where_the_reconciler_may_not_read_claims_a_claim_pool_says_so() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=False, refused="GET resourceslices: forbidden")
    status = await reconcile(c)
    assert stalled(status) == [("True", "DeviceClaimForbidden")]
    (c_,) = [x for x in status["conditions"] if x["type"] == "Stalled"]
    assert "manifests/clusterrole.yaml" in c_["message"]
    assert "GET resourceslices: forbidden" in c_["message"]
    assert [call for call in kube.calls if call[0] in ("apply", "delete")] == []


class Refusing(FakeKube):
    """Answers a list with the API server's refusal `status`."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    async def request(self, method: str, resource: Resource, namespace: str | None,
                      name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        if self.status:
            raise KubeError(f"{method} {resource.plural}: refused", self.status)
        return {"items": []}


@pytest.mark.parametrize(("status", "refused"), [(0, False), (403, True), (401, True)])
async def test_a_list_refused_by_rbac_is_told_apart(status: int, refused: bool) -> None:
    found = await Refusing(status).list_refused(RESOURCE_SLICES, None)
    assert (found is not None) is refused
    if refused:
        assert found is not None and "resourceslices: refused" in found


async def test_any_other_failure_of_the_list_is_raised() -> None:
    with pytest.raises(KubeError):
        await Refusing(503).list_refused(RESOURCE_SLICES, None)


async def test_the_claim_is_applied_before_the_first_member_is_scaled() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=True)
    status = await reconcile(c)
    assert all(s == "False" for s, _ in stalled(status))
    claim = index(kube.calls, ("apply", "ResourceClaim", "slot-gpu"))
    assert claim < index(kube.calls, ("apply", "Deployment", "a"))
    # not allocated yet: the budget is the largest member until it is
    assert status["device"] == {"claim": "slot-gpu", "allocated": None, "memory": None,
                                "budget": 8 * GIB}
    deployment = c.deployments.cache[(NS, "a")]
    spec = deployment["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "slot-gpu"}]
    assert "nvidia.com/gpu" not in str(spec["containers"][0].get("resources"))


async def test_the_budget_is_the_allocated_devices_memory_unless_one_is_stated() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=True)
    allocate(c, "24Gi")
    status = await reconcile(c)
    assert status["device"] == {"claim": "slot-gpu", "allocated": f"{DRIVER}/node/gpu-0",
                                "memory": 24 * GIB, "budget": 24 * GIB}
    state = c.pool_reconciler.states[(NS, "slot")]
    assert isinstance(state, r.ResidencyState) and state.config.gpu_memory == 24 * GIB

    stated = claim_controller(FakeKube(), served=True, gpuMemory="16Gi")
    allocate(stated, "24Gi")
    assert (await reconcile(stated))["device"]["budget"] == 16 * GIB


async def test_a_device_with_no_memory_published_needs_a_stated_budget() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=True)
    allocate(c, None)
    status = await reconcile(c)
    assert stalled(status) == [("True", "DeviceMemoryUnknown")]
    assert [call for call in kube.calls if call[:2] == ("apply", "Deployment")] == []

    fixed = claim_controller(FakeKube(), served=True, gpuMemory="16Gi")
    allocate(fixed, None)
    assert all(s == "False" for s, _ in stalled(await reconcile(fixed)))


async def test_a_pool_without_a_claim_applies_none_and_deletes_none() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=True)
    del c.pools.cache[(NS, "slot")]["spec"]["device"]
    c.pools.cache[(NS, "slot")]["spec"]["gpuMemory"] = "16Gi"
    status = await reconcile(c)
    assert [call for call in kube.calls if call[1] == "ResourceClaim"] == []
    assert "device" not in status or status["device"] is None


async def test_a_claim_the_pool_no_longer_asks_for_is_pruned() -> None:
    kube = FakeKube()
    c = claim_controller(kube, served=True)
    allocate(c, "24Gi")
    claims = c.ctx.stores.claims
    assert claims is not None
    claims.cache[(NS, "slot-gpu")]["metadata"]["ownerReferences"] = [
        {"kind": "ModelPool", "name": "slot", "uid": "uid-slot", "controller": True}]
    del c.pools.cache[(NS, "slot")]["spec"]["device"]
    await reconcile(c)
    assert ("delete", "ResourceClaim", "slot-gpu") in kube.calls


def test_a_claim_wakes_its_pool_and_a_device_wakes_the_claim_pools() -> None:
    c = claim_controller(FakeKube(), served=True)
    other = pool_body()
    other["metadata"]["name"] = "plain"
    c.pools.cache[(NS, "plain")] = other
    c._on_claim("MODIFIED", {"metadata": {"namespace": NS, "name": "slot-gpu",
                                          "labels": {"modelpool.dev/pool": "slot"}}})
    assert queued(c) == {Key(POOL, NS, "slot")}
    c._on_devices("ADDED", {"metadata": {"name": "node-slice"}})
    assert queued(c) == {Key(POOL, NS, "slot")}
