"""A budgeted pool that shares its device through a ResourceClaim, against the real API
server of the local cluster (which serves `resource.k8s.io/v1`) and its real scheduler.

The testbed runs no DRA driver: a test that wants a device publishes one itself (a
DeviceClass and a ResourceSlice on the testbed's node, of a driver named for the test), and
the scheduler allocates the claim from it; the node agent then runs the pods as it runs any
other. With no device of the class at all the claim stays unallocated, and the pool says
why, as it does for a member the scheduler will not place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kr8s.asyncio
import pytest

from reconciler.device_claim import GROUP_VERSION, claims_served
from reconciler.kube import Kube
from tests.integration.test_reconciler import (  # noqa: F401 (fixtures)
    GIB,
    Json,
    Running,
    apply,
    condition,
    crds,
    eventually,
    pool,
    ready_reason,
    reconciler,
    replicas,
    residents_are,
    server,
)

pytestmark = pytest.mark.integration


async def test_the_reconciler_finds_the_api_served_and_a_group_version_not_served(
    api: kr8s.asyncio.Api,
) -> None:
    """What the reconciler asks at start: the testbed's API server (Kubernetes 1.35) serves
    `resource.k8s.io/v1`; a group version it does not serve answers None, and a claim
    pool is then stalled (tests/unit/test_claim_pool_shell.py)."""
    kube = Kube(api)
    assert claims_served(await kube.discover(GROUP_VERSION))
    assert await kube.discover("resource.k8s.io/v9") is None


def claim_pool(sizes: dict[str, int], device_class: str, budget: str | None = None) -> Json:
    body = pool(sorted(sizes), budget="120s")
    body["spec"]["device"] = {"claim": {"deviceClassName": device_class}}
    if budget is not None:
        body["spec"]["gpuMemory"] = budget
    for entry in body["spec"]["members"]:
        entry["gpuMemory"] = str(sizes[entry["name"]])
    return body


@pytest.fixture
def published_device(kubectl: Any, namespace: str) -> Iterator[str]:
    """A DeviceClass of this test's own driver, and a ResourceSlice of that driver on the
    testbed's node publishing one device of 16 GiB; the class's name."""
    driver = f"gpu-{namespace[-6:]}.test.modelpool.dev"
    node = kubectl.json("get", "nodes")["items"][0]["metadata"]["name"]
    objects = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": driver},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": f"{driver}-{node}"[:253]},
         "spec": {"driver": driver, "nodeName": node,
                  "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}},
                               "capacity": {"memory": {"value": "16Gi"}}}]}},
    ]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kubectl("apply", "-f", "-", input=listed)
    try:
        yield driver
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=listed,
                check=False)


async def test_a_claim_pool_shares_one_allocated_device_and_its_budget_is_its_memory(
    reconciler: Running, kubectl: Any, namespace: str, published_device: str,  # noqa: F811
) -> None:
    """No spec.gpuMemory: until the claim is allocated the pool counts against its largest
    member (12 GiB), so a loads alone; its pod allocates the claim, whose device publishes
    16 GiB, and that is the budget from then on: b (8 GiB) loads beside a, nobody evicted
    (against 12 GiB it would have evicted a). Both pods reference the pool's one claim and
    request no GPU of a device plugin."""
    sizes = {"a": 8 * GIB, "b": 8 * GIB, "c": 12 * GIB}
    apply(kubectl, namespace, *(server(m) for m in sizes), claim_pool(sizes, published_device))
    await residents_are(reconciler, {"a"})

    async def device() -> Json | None:
        found = ((await reconciler.pool()).get("status") or {}).get("device") or {}
        return found if found.get("memory") is not None else None

    status = await eventually(device, "the pool to learn its device's memory", 60)
    assert (status["claim"], status["memory"], status["budget"]) == (
        "slot-gpu", 16 * GIB, 16 * GIB), status
    assert status["allocated"].startswith(f"{published_device}/"), status
    assert status["allocated"].endswith("/gpu-0"), status
    claim = kubectl.json("get", "resourceclaim", "slot-gpu", "-n", namespace)
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "ModelPool"
    request = claim["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == published_device

    await reconciler.request("b")
    body = await residents_are(reconciler, {"a", "b"})
    assert body["status"]["roomLeft"] == 0
    assert replicas(kubectl, namespace, "a") == 1, "a fits beside b: never drained"
    for member in ("a", "b"):
        spec = kubectl.json("get", "deployment", member, "-n", namespace)["spec"]["template"][
            "spec"]
        assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "slot-gpu"}]
        resources = spec["containers"][0]["resources"]
        assert resources["claims"] == [{"name": "gpu"}], resources
        assert "nvidia.com/gpu" not in json.dumps(resources), resources
    reserved = kubectl.json("get", "resourceclaim", "slot-gpu", "-n", namespace)["status"]
    assert len(reserved["reservedFor"]) == 2, reserved


async def test_a_claim_that_cannot_be_allocated_makes_the_pool_say_why(
    reconciler: Running, kubectl: Any, namespace: str,  # noqa: F811
) -> None:
    """A device class nobody publishes: the scheduler will not place the member's pod,
    and the pool says so in the scheduler's words and its own (which claim, which class,
    why it is not allocated), as it does for a member short of a device plugin's GPU."""
    missing = f"missing-{namespace[-6:]}.test.modelpool.dev"
    apply(kubectl, namespace, server("a"), claim_pool({"a": 8 * GIB}, missing))
    ready, reconciling = await ready_reason(reconciler, "Unschedulable",
                                            "the pool to say its claim is not allocated")
    assert ready["status"] == "False"
    assert ready["message"].startswith("a cannot be scheduled: "), ready
    assert (f"ResourceClaim slot-gpu (device class {missing}) is not allocated: "
            f"DeviceClass {missing} does not exist") in ready["message"], ready
    assert reconciling is not None and reconciling["reason"] == "Unschedulable"
    claim = kubectl.json("get", "resourceclaim", "slot-gpu", "-n", namespace)
    assert not (claim.get("status") or {}).get("allocation"), claim
    body = await reconciler.pool()
    # unallocated: no device, no memory; the budget its largest member until then
    assert body["status"]["device"] == {"claim": "slot-gpu", "budget": 8 * GIB}, body["status"]
    assert (condition(body, "Stalled") or {"status": "False"})["status"] == "False"


async def test_removing_the_claim_prunes_it_and_the_members_request_the_gpu_again(
    reconciler: Running, kubectl: Any, namespace: str,  # noqa: F811
) -> None:
    """The pool's claim goes with spec.device, and its members are rendered as a device
    plugin's members again (the gate to them unchanged)."""
    missing = f"missing-{namespace[-6:]}.test.modelpool.dev"
    body = claim_pool({"a": 8 * GIB}, missing, budget="16Gi")
    apply(kubectl, namespace, server("a", gpu=0), body)

    async def claimed() -> bool | None:
        found = kubectl.json_or_none("get", "resourceclaim", "slot-gpu", "-n", namespace)
        return True if found is not None else None

    await eventually(claimed, "the pool's ResourceClaim", 30)
    del body["spec"]["device"]
    apply(kubectl, namespace, body)

    async def pruned() -> bool | None:
        found = kubectl.json_or_none("get", "resourceclaim", "slot-gpu", "-n", namespace)
        return True if found is None else None

    await eventually(pruned, "the ResourceClaim pruned", 30)

    async def unclaimed() -> bool | None:
        spec = kubectl.json("get", "deployment", "a", "-n", namespace)["spec"]["template"][
            "spec"]
        return True if "resourceClaims" not in spec else None

    await eventually(unclaimed, "a's pods no longer referencing the claim", 30)
