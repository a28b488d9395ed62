"""What a budgeted pool's members and its claim render as (`reconciler.render`): a claim
pool's ResourceClaim, its members' pods referencing it instead of requesting a device
plugin's GPU, and a vLLM member's share of the device. An exclusive pool's members are the
golden files' (tests/unit/test_render.py), unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from reconciler.render import POOL_KINDS, Renderer, RenderError
from reconciler.spec import ModelPoolSpec, ModelServerSpec
from tests.unit.test_render_cases import GEMMA, QWEN, body

pytestmark = pytest.mark.unit

RENDERER = Renderer()
GIB = 1 << 30


def claim_pool(device: dict[str, Any] | None = None) -> ModelPoolSpec:
    return ModelPoolSpec.from_body(body("ModelPool", "gpu0", {
        "members": [{"name": "gemma", "gpuMemory": "8Gi"}, {"name": "qwen", "gpuMemory": "6Gi"}],
        "device": {"claim": device if device is not None else {}}}, uid="uid-pool"))


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def with_gpu(ms: ModelServerSpec) -> ModelServerSpec:
    return replace(ms, resources=replace(ms.resources, gpu=1))


def test_a_claim_pool_renders_its_resource_claim_owned_by_the_pool() -> None:
    claim = RENDERER.pool_claim(claim_pool(), owner_uid="uid-pool")
    assert (claim["apiVersion"], claim["kind"]) in POOL_KINDS
    assert claim["metadata"]["name"] == "gpu0-gpu"
    assert claim["metadata"]["namespace"] == "demo"
    assert claim["metadata"]["labels"]["modelpool.dev/pool"] == "gpu0"
    assert claim["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "modelpool-reconciler"
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ModelPool", "gpu0", "uid-pool", True)
    assert claim["spec"] == {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}


def test_the_claims_device_class_is_the_pools_to_name() -> None:
    claim = RENDERER.pool_claim(claim_pool({"deviceClassName": "gpu.fake.modelpool.dev"}),
                                owner_uid=None)
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        "gpu.fake.modelpool.dev")
    assert "ownerReferences" not in claim["metadata"]


def test_a_pool_without_a_claim_renders_none() -> None:
    pool = ModelPoolSpec.from_body(body("ModelPool", "gpu0", {
        "members": [{"name": "gemma"}], "gpuMemory": "16Gi"}))
    with pytest.raises(RenderError, match=r"no spec\.device\.claim"):
        RENDERER.pool_claim(pool, owner_uid=None)


def test_a_claim_pools_member_references_the_claim_and_requests_no_gpu_resource() -> None:
    spec = pod_spec(RENDERER.model_server(with_gpu(GEMMA), replicas=1, owner_uid="u",
                                          pool="gpu0", gpu_footprint=8 * GIB,
                                          device_claim="gpu0-gpu", device_memory=16 * GIB))
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "gpu0-gpu"}]
    (container,) = spec["containers"]
    assert container["resources"] == {"requests": {"memory": "8Gi"},
                                      "limits": {"memory": "8Gi"},
                                      "claims": [{"name": "gpu"}]}
    # still behind the pool's gate: the residency releases it
    assert spec["schedulingGates"] == [{"name": "modelpool.dev/slot"}]
    # llama.cpp takes what it loads: no fraction to pass
    assert not any("utilization" in a for a in container["args"])


def test_a_member_of_a_pool_without_a_claim_requests_a_share_of_the_gpu_resource() -> None:
    spec = pod_spec(RENDERER.model_server(with_gpu(GEMMA), replicas=1, owner_uid="u",
                                          pool="gpu0", gpu_footprint=8 * GIB,
                                          device_memory=16 * GIB))
    assert "resourceClaims" not in spec
    resources = spec["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert "claims" not in resources


@pytest.mark.parametrize(("args", "memory", "expected"), [
    # its share of the device, before its own args
    (("--max-model-len", "8192"), 16 * GIB,
     ["--gpu-memory-utilization", "0.3750", "--max-model-len", "8192"]),
    # its own fraction is kept
    (("--gpu-memory-utilization", "0.2"), 16 * GIB, ["--gpu-memory-utilization", "0.2"]),
    # the device's memory not known yet
    (("--max-model-len", "8192"), None, ["--max-model-len", "8192"]),
])
def test_a_vllm_member_is_given_its_share_of_the_device(
    args: tuple[str, ...], memory: int | None, expected: list[str]
) -> None:
    qwen = replace(QWEN, args=args)
    spec = pod_spec(RENDERER.model_server(qwen, replicas=1, owner_uid="u", pool="gpu0",
                                          gpu_footprint=6 * GIB, device_claim="gpu0-gpu",
                                          device_memory=memory))
    rendered = spec["containers"][0]["args"]
    assert rendered[:6] == ["--model", QWEN.model, "--port", "8000", "--served-model-name",
                            "qwen"]
    assert rendered[6:] == expected


def test_an_exclusive_pools_vllm_member_gets_no_share() -> None:
    spec = pod_spec(RENDERER.model_server(QWEN, replicas=1, owner_uid="u", pool="gpu0"))
    assert not any("utilization" in a for a in spec["containers"][0]["args"])
    assert "resourceClaims" not in spec

