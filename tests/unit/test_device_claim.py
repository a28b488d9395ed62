"""A claim pool's device, read from the API server's bodies (`reconciler.device_claim`):
whether the API is served, the allocated device and its published memory, the budget that
defaults to it, and why a claim stays unallocated. Tables of cases."""

from __future__ import annotations

import re
from typing import Any

import pytest

from reconciler import device_claim as dc
from reconciler.spec import ModelPoolSpec, SpecError

pytestmark = pytest.mark.unit

GIB = 1 << 30
DRIVER = "gpu.fake.modelpool.dev"


def pool(**spec: Any) -> ModelPoolSpec:
    return ModelPoolSpec.from_body({
        "apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelPool",
        "metadata": {"namespace": "ns", "name": "slot"},
        "spec": {"members": [{"name": "a"}, {"name": "b"}], **spec}})


def resources(*names: str) -> dict[str, Any]:
    return {"kind": "APIResourceList", "groupVersion": "resource.k8s.io/v1",
            "resources": [{"name": n} for n in names]}


@pytest.mark.parametrize(("answer", "served"), [
    (None, False),  # 404: the group version is not served (Kubernetes before 1.34)
    (resources(), False),
    # a server that serves the slices only is no place for a claim
    (resources("resourceslices", "deviceclasses"), False),
    (resources("resourceclaims", "resourceclaims/status", "resourceclaimtemplates",
               "resourceslices", "deviceclasses"), True),
])
def test_claims_are_served_only_where_discovery_lists_the_three_resources(
    answer: dict[str, Any] | None, served: bool
) -> None:
    assert dc.claims_served(answer) is served


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    status = {"allocation": {"devices": {"results": list(results)}}} if results else {}
    return {"metadata": {"name": "slot-gpu"}, "status": status}


def result(device: str = "gpu-0", request: str = "gpu", pool_: str = "node-1"
           ) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": pool_, "device": device}


@pytest.mark.parametrize(("body", "found"), [
    (None, None),
    (claim(), None),
    (claim(result()), dc.Allocated(DRIVER, "node-1", "gpu-0")),
    (claim(result("gpu-1", request="other"), result("gpu-2")),
     dc.Allocated(DRIVER, "node-1", "gpu-2")),
])
def test_the_allocated_device_is_the_result_for_the_claims_request(
    body: dict[str, Any] | None, found: dc.Allocated | None
) -> None:
    assert dc.allocated(body) == found


def slice_(memory: Any = "16Gi", driver: str = DRIVER, pool_: str = "node-1",
           generation: int = 1, device: str = "gpu-0") -> dict[str, Any]:
    capacity = {} if memory is None else {"memory": {"value": memory}}
    return {"spec": {"driver": driver, "pool": {"name": pool_, "generation": generation},
                     "devices": [{"name": device, "capacity": capacity}]}}


DEVICE = dc.Allocated(DRIVER, "node-1", "gpu-0")


@pytest.mark.parametrize(("slices", "memory"), [
    ([slice_()], 16 * GIB),
    ([slice_("24G")], 24 * 10**9),
    ([], None),
    ([slice_(None)], None),  # the driver publishes no memory
    ([slice_("lots")], None),
    ([slice_(driver="other.example.com")], None),
    ([slice_(pool_="node-2")], None),
    ([slice_(device="gpu-1")], None),
    # a pool's newest generation is its driver's current word
    ([slice_("8Gi", generation=1), slice_("16Gi", generation=2)], 16 * GIB),
    ([slice_("16Gi", generation=2), slice_("8Gi", generation=1)], 16 * GIB),
])
def test_the_devices_memory_is_what_its_driver_publishes(
    slices: list[dict[str, Any]], memory: int | None
) -> None:
    assert dc.device_memory(slices, DEVICE) == memory


SIZES = {"a": 8 * GIB, "b": 12 * GIB}


@pytest.mark.parametrize(("spec", "device", "budget", "problem"), [
    # a stated budget wins over the device's memory
    ({"gpuMemory": "20Gi", "device": {"claim": {}}}, dc.Device("slot-gpu", DEVICE, 16 * GIB),
     20 * GIB, None),
    ({"gpuMemory": "20Gi"}, None, 20 * GIB, None),
    ({"device": {"claim": {}}}, dc.Device("slot-gpu", DEVICE, 16 * GIB), 16 * GIB, None),
    # not allocated yet: the largest member, so the first load can be placed
    ({"device": {"claim": {}}}, dc.Device("slot-gpu"), 12 * GIB, None),
    # allocated, and no memory published: the spec must say it
    ({"device": {"claim": {}}}, dc.Device("slot-gpu", DEVICE), 0, dc.DEVICE_MEMORY_UNKNOWN),
])
def test_the_budget_is_the_stated_one_else_the_devices_memory(
    spec: dict[str, Any], device: dc.Device | None, budget: int, problem: str | None
) -> None:
    found, why = dc.budget(pool(**spec), device, SIZES)
    assert found == budget
    assert (why.reason if why is not None else None) == problem
    if why is not None:
        assert "set spec.gpuMemory" in why.message and str(DEVICE) in why.message


@pytest.mark.parametrize(("spec", "device", "memory"), [
    ({"gpuMemory": "20Gi", "device": {"claim": {}}}, dc.Device("c", DEVICE, 16 * GIB),
     16 * GIB),
    ({"gpuMemory": "20Gi", "device": {"claim": {}}}, dc.Device("c"), 20 * GIB),
    ({"gpuMemory": "20Gi"}, None, 20 * GIB),
    ({"device": {"claim": {}}}, dc.Device("c"), None),
])
def test_a_members_share_is_of_the_published_memory_else_the_stated_budget(
    spec: dict[str, Any], device: dc.Device | None, memory: int | None
) -> None:
    assert dc.share_memory(pool(**spec), device) == memory


CLASS = {"metadata": {"name": "gpu.nvidia.com"}}


@pytest.mark.parametrize(("classes", "slices", "why"), [
    ([], [slice_()], "DeviceClass gpu.nvidia.com does not exist"),
    ([CLASS], [], "no ResourceSlice publishes a device"),
    ([CLASS], [{"spec": {"devices": []}}], "no ResourceSlice publishes a device"),
    ([CLASS], [slice_()], "no device of class gpu.nvidia.com is free"),
])
def test_why_a_claim_is_not_allocated(classes: list[dict[str, Any]],
                                      slices: list[dict[str, Any]], why: str) -> None:
    assert why in dc.unallocated("gpu.nvidia.com", classes, slices)


def test_the_explanation_names_the_member_the_scheduler_the_claim_and_the_class() -> None:
    assert dc.explain("a", "0/1 nodes are available. ", "slot-gpu", "gpu.nvidia.com",
                      "no ResourceSlice publishes a device") == (
        "a cannot be scheduled: 0/1 nodes are available. ResourceClaim slot-gpu (device "
        "class gpu.nvidia.com) is not allocated: no ResourceSlice publishes a device")


def test_without_the_api_the_problem_names_it_and_the_way_out() -> None:
    problem = dc.unsupported_problem(pool(device={"claim": {}}))
    assert problem.reason == "DeviceClaimUnsupported" and not problem.pending
    assert "resource.k8s.io/v1" in problem.message
    assert "device plugin's shares" in problem.message


def test_a_reconciler_refused_the_api_says_what_to_grant() -> None:
    problem = dc.unsupported_problem(pool(device={"claim": {}}), "list: forbidden")
    assert problem.reason == "DeviceClaimForbidden"
    assert "manifests/clusterrole.yaml" in problem.message
    assert "list: forbidden" in problem.message


def test_the_device_status() -> None:
    assert dc.status_of(dc.Device("slot-gpu", DEVICE, 16 * GIB), 16 * GIB) == {
        "claim": "slot-gpu", "allocated": f"{DRIVER}/node-1/gpu-0", "memory": 16 * GIB,
        "budget": 16 * GIB}
    assert dc.status_of(dc.Device("slot-gpu"), 8 * GIB) == {
        "claim": "slot-gpu", "allocated": None, "memory": None, "budget": 8 * GIB}


@pytest.mark.parametrize(("spec", "claim", "budgeted"), [
    ({}, None, False),
    ({"gpuMemory": "16Gi"}, None, True),
    ({"device": {}}, None, False),
    ({"device": {"claim": {}}}, "gpu.nvidia.com", True),
    ({"device": {"claim": {"deviceClassName": "gpu.fake.modelpool.dev"}}},
     "gpu.fake.modelpool.dev", True),
    ({"device": {"claim": {}}, "gpuMemory": "16Gi"}, "gpu.nvidia.com", True),
])
def test_spec_device_claim_names_a_class_and_makes_the_pool_budgeted(
    spec: dict[str, Any], claim: str | None, budgeted: bool
) -> None:
    parsed = pool(**spec)
    assert (parsed.claim.device_class_name if parsed.claim else None) == claim
    assert parsed.budgeted is budgeted


@pytest.mark.parametrize(("device", "error"), [
    ({"claim": {"deviceClassName": ""}}, "must not be empty"),
    ({"claim": {"deviceClassName": 3}}, "spec.device.claim.deviceClassName must be a string"),
    ({"claim": "gpu.nvidia.com"}, "spec.device.claim must be an object"),
    ("claim", "spec.device must be an object"),
])
def test_a_bad_device_claim_is_refused_naming_the_field(device: Any, error: str) -> None:
    with pytest.raises(SpecError, match=re.escape(error)):
        pool(device=device)
