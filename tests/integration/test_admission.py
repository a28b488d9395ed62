"""Admission against the real API server: the CRDs' schemas and CEL rules reject bad specs
with a message naming the field and create nothing; good specs are defaulted as
reconciler/spec.py assumes; the install passes a server-side dry run; and what the
reconciler renders is valid and passes the `restricted` Pod Security level."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import wait_established
from e2e.local.controlplane import LocalCluster
from e2e.local.fixtures import Kubectl, fresh_namespace
from reconciler.render import Renderer
from reconciler.spec import ModelPoolSpec, ModelRouterSpec, ModelServerSpec
from tests.unit.test_render_cases import CHAT, EMBED, GEMMA, POOL, QWEN, SERVERS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "manifests" / "crds"
KINDS = "modelservers.modelpool.dev,modelpools.modelpool.dev,modelrouters.modelpool.dev"


@pytest.fixture(scope="module")
def module_kubectl(cluster: LocalCluster) -> Kubectl:
    """kubectl for the module's fixtures (the `kubectl` fixture is a test's own)."""
    return Kubectl(cluster.kubeconfig, shutil.which("kubectl") or str(cluster.bin_dir / "kubectl"))


@pytest.fixture(scope="module")
def crds(module_kubectl: Kubectl) -> Iterator[None]:
    kubectl = module_kubectl
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    wait_established(kubectl, KINDS.split(","))
    yield


@pytest.fixture(scope="module")
def refused_namespace(module_kubectl: Kubectl) -> Iterator[str]:
    """One namespace for every manifest admission refuses: a refused manifest leaves nothing
    in it (each such test checks), so the next finds it as empty as a fresh one."""
    with fresh_namespace(module_kubectl, f"{__name__}::refused") as name:
        yield name


def _obj(kind: str, name: str, spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


_SERVER = {"image": "ghcr.io/ggml-org/llama.cpp:server-cuda", "model": "/models/m.gguf"}
_MEMBERS = [{"name": "a"}, {"name": "b"}]
_URL = {"name": "a", "url": "http://10.0.0.9:8000"}

# (id, manifest, what the error must say: the field path and, for CEL, the rule's message)
INVALID: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    # ModelPool: CEL rules
    (
        "pool-default-not-a-member",
        _obj("ModelPool", "p", {"members": _MEMBERS, "default": "c"}),
        ("spec.default", "must name one of spec.members"),
    ),
    (
        "pool-members-not-unique",
        _obj("ModelPool", "p", {"members": [{"name": "a"}, {"name": "a"}]}),
        ("spec.members", "names must be unique"),
    ),
    (
        "pool-swap-budget-zero",
        _obj("ModelPool", "p", {"members": _MEMBERS, "swapBudget": "0s"}),
        ("spec.swapBudget", "positive duration"),
    ),
    (
        "pool-min-residency-zero",
        _obj("ModelPool", "p", {"members": _MEMBERS, "minResidency": "0ms"}),
        ("spec.minResidency", "positive duration"),
    ),
    (
        "pool-max-wait-not-a-duration",
        _obj("ModelPool", "p", {"members": _MEMBERS, "maxWait": "5 minutes"}),
        ("spec.maxWait", "should match"),
    ),
    (
        "pool-reclaim-after-negative",
        _obj("ModelPool", "p", {"members": _MEMBERS, "reclaimAfter": "-1s"}),
        ("spec.reclaimAfter",),
    ),
    (
        "pool-idle-unload-after-zero",
        _obj("ModelPool", "p", {"members": _MEMBERS, "idleUnloadAfter": "0s"}),
        ("spec.idleUnloadAfter", "positive duration"),
    ),
    (
        "pool-idle-unload-after-not-a-duration",
        _obj("ModelPool", "p", {"members": _MEMBERS, "idleUnloadAfter": "soon"}),
        ("spec.idleUnloadAfter", "should match"),
    ),
    (
        "pool-fair-without-max-wait",
        _obj("ModelPool", "p", {"members": _MEMBERS, "swapPolicy": "fair"}),
        ("spec.maxWait", "required when spec.swapPolicy is fair"),
    ),
    (
        "pool-reclaim-without-default",
        _obj(
            "ModelPool", "p", {"members": _MEMBERS, "swapPolicy": "reclaim", "reclaimAfter": "10m"}
        ),
        ("spec.reclaimAfter", "spec.default and spec.reclaimAfter are required"),
    ),
    (
        "pool-member-not-a-server-name",
        _obj("ModelPool", "p", {"members": [{"name": "a"}, {"name": "B"}]}),
        ("spec.members[1].name", "should match"),
    ),
    # ModelPool: the device shared through a ResourceClaim
    (
        "pool-device-class-not-a-subdomain",
        _obj("ModelPool", "p", {"members": _MEMBERS,
                                "device": {"claim": {"deviceClassName": "GPU_nvidia"}}}),
        ("spec.device.claim.deviceClassName", "should match"),
    ),
    (
        "pool-device-class-empty",
        _obj("ModelPool", "p", {"members": _MEMBERS,
                                "device": {"claim": {"deviceClassName": ""}}}),
        ("spec.device.claim.deviceClassName", "at least 1 chars long"),
    ),
    # ModelPool: the GPU memory budget and its members' footprints
    (
        "pool-gpu-memory-negative",
        _obj("ModelPool", "p", {"members": _MEMBERS, "gpuMemory": "-48Gi"}),
        ("spec.gpuMemory", "must be a positive quantity"),
    ),
    (
        "pool-gpu-memory-negative-integer",
        _obj("ModelPool", "p", {"members": _MEMBERS, "gpuMemory": -1}),
        ("spec.gpuMemory", "must be a positive quantity"),
    ),
    (
        "pool-gpu-memory-zero",
        _obj("ModelPool", "p", {"members": _MEMBERS, "gpuMemory": "0Gi"}),
        ("spec.gpuMemory", "must be a positive quantity"),
    ),
    (
        "pool-gpu-memory-unparseable",
        _obj("ModelPool", "p", {"members": _MEMBERS, "gpuMemory": "48 gigs"}),
        ("spec.gpuMemory", "must be a quantity of bytes"),
    ),
    (
        "pool-gpu-memory-fractional-exponent",
        _obj("ModelPool", "p", {"members": _MEMBERS, "gpuMemory": "1e1.5"}),
        ("spec.gpuMemory", "must be a quantity of bytes"),
    ),
    (
        "pool-member-gpu-memory-over-budget",
        _obj("ModelPool", "p", {"members": [{"name": "a", "gpuMemory": "8Gi"},
                                            {"name": "b", "gpuMemory": "49Gi"}],
                                "gpuMemory": "48Gi"}),
        ("spec.members", "must not exceed spec.gpuMemory"),
    ),
    (
        "pool-member-gpu-memory-over-a-decimal-budget",
        _obj("ModelPool", "p", {"members": [{"name": "a", "gpuMemory": "16Gi"}],
                                "gpuMemory": 17 * 10**9}),
        ("spec.members", "must not exceed spec.gpuMemory"),
    ),
    (
        "pool-member-gpu-memory-negative",
        _obj("ModelPool", "p", {"members": [{"name": "a", "gpuMemory": "-8Gi"}],
                                "gpuMemory": "48Gi"}),
        ("spec.members[0].gpuMemory", "must be a positive quantity"),
    ),
    (
        "pool-member-gpu-memory-unparseable",
        _obj("ModelPool", "p", {"members": [{"name": "a", "gpuMemory": "8GB"}]}),
        ("spec.members[0].gpuMemory", "must be a quantity of bytes"),
    ),
    # ModelPool: schema
    ("pool-no-members", _obj("ModelPool", "p", {"members": []}), ("spec.members", "at least 1")),
    (
        "pool-members-missing",
        _obj("ModelPool", "p", {"default": "a"}),
        ("spec.members", "Required value"),
    ),
    (
        "pool-policy-unknown",
        _obj("ModelPool", "p", {"members": _MEMBERS, "swapPolicy": "random"}),
        ("spec.swapPolicy", "Unsupported value"),
    ),
    (
        "pool-members-wrong-type",
        _obj("ModelPool", "p", {"members": "a,b"}),
        ("spec.members", "must be of type array"),
    ),
    (
        "pool-priority-wrong-type",
        _obj("ModelPool", "p", {"members": [{"name": "a", "priority": "high"}]}),
        ("spec.members[0].priority", "must be of type integer"),
    ),
    (
        "pool-member-without-name",
        _obj("ModelPool", "p", {"members": [{"priority": 1}]}),
        ("spec.members[0].name", "Required value"),
    ),
    (
        "pool-name-too-long-for-a-label",
        _obj("ModelPool", "p" * 64, {"members": _MEMBERS}),
        ("metadata.name", "at most 63 characters"),
    ),
    # ModelServer
    (
        "server-port-too-high",
        _obj("ModelServer", "s", {**_SERVER, "port": 70000}),
        ("spec.port", "between 1 and 65535"),
    ),
    (
        "server-port-zero",
        _obj("ModelServer", "s", {**_SERVER, "port": 0}),
        ("spec.port", "between 1 and 65535"),
    ),
    (
        "server-port-wrong-type",
        _obj("ModelServer", "s", {**_SERVER, "port": "http"}),
        ("spec.port", "must be of type integer"),
    ),
    (
        "server-image-missing",
        _obj("ModelServer", "s", {"model": "/m.gguf"}),
        ("spec.image", "Required value"),
    ),
    (
        "server-vllm-without-model",
        _obj("ModelServer", "s", {"runtime": "vllm", "image": "vllm/vllm-openai:v0.11.0"}),
        ("spec.model", "required for the llamacpp and vllm runtimes"),
    ),
    (
        "server-runtime-unknown",
        _obj("ModelServer", "s", {**_SERVER, "runtime": "ollama"}),
        ("spec.runtime", "Unsupported value"),
    ),
    (
        "server-storage-both",
        _obj("ModelServer", "s", {**_SERVER, "storage": {"pvc": "w", "hostPath": "/w"}}),
        ("spec.storage", "exactly one of pvc and hostPath"),
    ),
    (
        "server-scratch-wrong-type",
        _obj("ModelServer", "s", {**_SERVER, "scratch": "no"}),
        ("spec.scratch", "must be of type boolean"),
    ),
    (
        "server-gpu-negative",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"gpu": -1}}),
        ("spec.resources.gpu",),
    ),
    (
        "server-gpu-memory-negative",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"gpuMemory": "-8Gi"}}),
        ("spec.resources.gpuMemory", "must be a positive quantity"),
    ),
    (
        "server-gpu-memory-unparseable",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"gpuMemory": "eight gigs"}}),
        ("spec.resources.gpuMemory", "must be a quantity of bytes"),
    ),
    (
        "server-kv-cache-on-vllm",
        _obj("ModelServer", "s", {**_SERVER, "runtime": "vllm",
                                   "kvCache": {"persist": True, "pvc": "kv"}}),
        ("spec.kvCache", "needs runtime llamacpp"),
    ),
    (
        "server-kv-cache-persist-without-a-claim",
        _obj("ModelServer", "s", {**_SERVER, "kvCache": {"persist": True}}),
        ("spec.kvCache.pvc", "persist needs spec.kvCache.pvc"),
    ),
    (
        "server-kv-cache-max-size-negative",
        _obj("ModelServer", "s", {**_SERVER, "kvCache": {"pvc": "kv", "maxSize": "-1Gi"}}),
        ("spec.kvCache.maxSize", "must be a positive quantity"),
    ),
    (
        "server-kv-cache-save-timeout-not-a-duration",
        _obj("ModelServer", "s", {**_SERVER, "kvCache": {"pvc": "kv", "saveTimeout": "soon"}}),
        ("spec.kvCache.saveTimeout", "should match"),
    ),
    (
        "server-name-not-a-label",
        _obj("ModelServer", "9-lives", _SERVER),
        ("metadata.name", "DNS-1035 label"),
    ),
    (
        "server-args-wrong-type",
        _obj("ModelServer", "s", {**_SERVER, "args": "--ctx-size 4096"}),
        ("spec.args", "must be of type array"),
    ),
    (
        "server-toleration-without-key-not-exists",
        _obj("ModelServer", "s", {**_SERVER, "tolerations": [{"operator": "Equal", "value": "x"}]}),
        ("spec.tolerations[0]", "without a key must have operator Exists"),
    ),
    (
        "server-toleration-exists-with-value",
        _obj("ModelServer", "s", {**_SERVER, "tolerations": [
            {"key": "gpu", "operator": "Exists", "value": "yes"}]}),
        ("spec.tolerations[0]", "with operator Exists must have no value"),
    ),
    (
        "server-toleration-seconds-without-no-execute",
        _obj("ModelServer", "s", {**_SERVER, "tolerations": [
            {"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}]}),
        ("spec.tolerations[0]", "with tolerationSeconds must have effect NoExecute"),
    ),
    (
        "server-toleration-key-not-a-label-key",
        _obj("ModelServer", "s", {**_SERVER, "tolerations": [
            {"key": "a b", "operator": "Exists"}]}),
        ("spec.tolerations[0].key", "should match"),
    ),
    (
        "server-node-selector-key-not-a-label-key",
        _obj("ModelServer", "s", {**_SERVER, "nodeSelector": {"gpu type": "a100"}}),
        ("spec.nodeSelector", "keys must be label keys"),
    ),
    (
        "server-node-selector-value-not-a-label-value",
        _obj("ModelServer", "s", {**_SERVER, "nodeSelector": {"gpu": "/dev/nvidia0"}}),
        ("spec.nodeSelector.gpu", "should match"),
    ),
    (
        "server-env-value-from-names-no-source",
        _obj("ModelServer", "s", {**_SERVER, "env": [{"name": "TOKEN", "valueFrom": {}}]}),
        ("spec.env[0].valueFrom", "exactly one of fieldRef"),
    ),
    (
        "server-env-value-and-value-from",
        _obj("ModelServer", "s", {**_SERVER, "env": [{"name": "POD", "value": "x", "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.name"}}}]}),
        ("spec.env[0]", "value or valueFrom, not both"),
    ),
    (
        "server-env-field-path-not-offered",
        _obj("ModelServer", "s", {**_SERVER, "env": [{"name": "IMAGE", "valueFrom": {
            "fieldRef": {"fieldPath": "spec.containers[0].image"}}}]}),
        ("spec.env[0].valueFrom.fieldRef.fieldPath", "should match"),
    ),
    (
        "server-env-secret-without-key",
        _obj("ModelServer", "s", {**_SERVER, "env": [{"name": "TOKEN", "valueFrom": {
            "secretKeyRef": {"name": "hf"}}}]}),
        ("spec.env[0].valueFrom.secretKeyRef.key", "Required value"),
    ),
    (
        "server-env-name-with-equals",
        _obj("ModelServer", "s", {**_SERVER, "env": [{"name": "A=B", "value": "1"}]}),
        ("spec.env[0].name", "should match"),
    ),
    (
        "server-pvc-not-a-name",
        _obj("ModelServer", "s", {**_SERVER, "storage": {"pvc": "weights/gemma"}}),
        ("spec.storage.pvc", "should match"),
    ),
    (
        "server-cpu-negative",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"cpu": "-500m"}}),
        ("spec.resources.cpu", "should match"),
    ),
    (
        "server-memory-negative",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"memory": -1}}),
        ("spec.resources.memory", "greater than or equal to 0"),
    ),
    (
        "server-gpu-resource-not-an-extended-resource",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"gpuResource": "gpu"}}),
        ("spec.resources.gpuResource", "should match"),
    ),
    (
        "server-gpu-resource-in-the-kubernetes-domain",
        _obj("ModelServer", "s", {**_SERVER, "resources": {"gpuResource": "kubernetes.io/gpu"}}),
        ("spec.resources.gpuResource", "outside the kubernetes.io domain"),
    ),
    # ModelRouter
    (
        "router-proxy-toleration-without-key-not-exists",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"tolerations": [{"value": "x"}]}}),
        ("spec.proxy.tolerations[0]", "without a key must have operator Exists"),
    ),
    (
        "router-proxy-node-selector-key-not-a-label-key",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"nodeSelector": {"/x": "y"}}}),
        ("spec.proxy.nodeSelector", "keys must be label keys"),
    ),
    (
        "router-proxy-resource-not-the-routers",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {
            "resources": {"limits": {"nvidia.com/gpu": 1}}}}),
        ("spec.proxy.resources.limits", "takes cpu, memory and ephemeral-storage"),
    ),
    (
        "router-proxy-requests-over-limits",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {
            "resources": {"requests": {"cpu": 2}, "limits": {"cpu": "1500m"}}}}),
        ("spec.proxy.resources", "requests must not exceed"),
    ),
    (
        "router-proxy-limit-negative",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {
            "resources": {"limits": {"memory": "-64Mi"}}}}),
        ("spec.proxy.resources.limits.memory", "should match"),
    ),
    (
        "router-server-ref-not-a-server-name",
        _obj("ModelRouter", "r", {"backends": [
            {"name": "a", "modelServerRef": {"name": "Gemma"}}]}),
        ("spec.backends[0].modelServerRef.name", "should match"),
    ),
    (
        "router-api-key-secret-not-a-name",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"apiKeySecret": {"name": "a/b"}}}),
        ("spec.proxy.apiKeySecret.name", "should match"),
    ),
    (
        "router-api-key-secret-key-not-a-key",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {
            "apiKeySecret": {"name": "keys", "key": "a b"}}}),
        ("spec.proxy.apiKeySecret.key", "should match"),
    ),
    # ModelRouter
    (
        "router-backend-both",
        _obj("ModelRouter", "r", {"backends": [{**_URL, "modelServerRef": {"name": "s"}}]}),
        ("spec.backends[0]", "exactly one of modelServerRef and url"),
    ),
    (
        "router-backend-neither",
        _obj("ModelRouter", "r", {"backends": [{"name": "a"}]}),
        ("spec.backends[0]", "exactly one of modelServerRef and url"),
    ),
    (
        "router-backend-names-not-unique",
        _obj("ModelRouter", "r", {"backends": [_URL, _URL]}),
        ("spec.backends", "names must be unique"),
    ),
    (
        "router-default-route-unknown",
        _obj("ModelRouter", "r", {"backends": [_URL], "defaultRoute": "b"}),
        ("spec.defaultRoute", "must name one of spec.backends"),
    ),
    (
        "router-static-without-default",
        _obj("ModelRouter", "r", {"backends": [_URL], "routeStrategy": "Static"}),
        ("spec.defaultRoute", "required when spec.routeStrategy is Static"),
    ),
    (
        "router-proxy-port-out-of-range",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"port": 65536}}),
        ("spec.proxy.port", "between 1 and 65535"),
    ),
    (
        "router-timeout-zero",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"responseHeaderTimeout": "0s"}}),
        ("spec.proxy.responseHeaderTimeout", "positive duration"),
    ),
    (
        "router-shutdown-delay-over-an-hour",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"shutdownDelay": "1h1s"}}),
        ("spec.proxy.shutdownDelay", "at most 1h"),
    ),
    (
        "router-shutdown-delay-negative",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"shutdownDelay": "-5s"}}),
        ("spec.proxy.shutdownDelay", "should match"),
    ),
    (
        "router-shutdown-grace-zero",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"shutdownGracePeriod": "0s"}}),
        ("spec.proxy.shutdownGracePeriod", "positive duration of at most 1h"),
    ),
    (
        "router-backends-missing",
        _obj("ModelRouter", "r", {"defaultRoute": "a"}),
        ("spec.backends", "Required value"),
    ),
    (
        "router-max-held-zero",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"maxHeldRequests": 0}}),
        ("spec.proxy.maxHeldRequests",),
    ),
    (
        "router-fallback-to-no-backend",
        _obj("ModelRouter", "r", {"backends": [{**_URL, "fallback": {"name": "nowhere"}}]}),
        ("spec.backends", "fallback.name must name one of spec.backends"),
    ),
    (
        "router-fallback-to-itself",
        _obj("ModelRouter", "r", {"backends": [{**_URL, "fallback": {"name": _URL["name"]}}]}),
        ("spec.backends", "fall back in a loop"),
    ),
    (
        "router-fallbacks-to-each-other",
        _obj("ModelRouter", "r", {"backends": [
            {"name": "a", "url": "http://10.0.0.9:8000", "fallback": {"name": "b"}},
            {"name": "b", "url": "http://10.0.0.9:8001", "fallback": {"name": "a"}}]}),
        ("spec.backends", "fall back in a loop"),
    ),
    (
        "router-activation-unknown",
        _obj("ModelRouter", "r", {"backends": [{**_URL, "activation": "Sometimes"}]}),
        ("spec.backends[0].activation", "Unsupported value"),
    ),
    (
        "router-held-stream-progress-unknown",
        _obj("ModelRouter", "r", {"backends": [_URL], "proxy": {"heldStreamProgress": "Loud"}}),
        ("spec.proxy.heldStreamProgress", "Unsupported value"),
    ),
    (
        "router-url-not-http",
        _obj("ModelRouter", "r", {"backends": [{"name": "a", "url": "10.0.0.9:8000"}]}),
        ("spec.backends[0].url", "should match"),
    ),
]


def test_at_least_twelve_invalid_manifests() -> None:
    assert len(INVALID) >= 12
    assert len({case[0] for case in INVALID}) == len(INVALID)


@pytest.mark.parametrize(
    ("manifest", "expected"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_manifest_is_rejected_naming_the_field(
    crds: None,
    kubectl: Kubectl,
    refused_namespace: str,
    manifest: dict[str, Any],
    expected: tuple[str, ...],
) -> None:
    namespace = refused_namespace
    refusal = kubectl.refusal(namespace, manifest)
    assert refusal is not None, "accepted"
    assert "is invalid" in refusal, refusal
    for text in expected:
        assert text in refusal, f"{text!r} not in {refusal!r}"
    for kind in KINDS.split(","):
        assert kubectl.json("get", kind, "-n", namespace)["items"] == [], kind


@pytest.mark.parametrize("case", [INVALID[0], INVALID[-1]], ids=lambda c: str(c[0]))
def test_kubectl_prints_the_refusal_the_table_reads_in_process(
    crds: None,
    kubectl: Kubectl,
    refused_namespace: str,
    case: tuple[str, dict[str, Any], tuple[str, ...]],
) -> None:
    """The table above reads the API server's refusal in this process; what a person sees
    is kubectl's: the same causes, after kubectl's own words for the object."""
    _, manifest, expected = case
    result = kubectl("create", "-n", refused_namespace, "-f", "-", input=json.dumps(manifest),
                     check=False)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    in_process = kubectl.refusal(refused_namespace, manifest)
    assert in_process is not None and in_process.startswith("Error from server (Invalid): ")
    causes = in_process.partition(" is invalid: ")[2]
    assert causes and f'"{manifest["metadata"]["name"]}" is invalid: {causes}' in \
        result.stderr, (in_process, result.stderr)
    assert all(text in result.stderr for text in expected), result.stderr


def test_a_chain_of_fallbacks_without_a_loop_is_admitted(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    router = _obj("ModelRouter", "r", {"backends": [
        {"name": "a", "url": "http://10.0.0.9:8000", "activation": "Never",
         "fallback": {"name": "b", "model": "bee"}},
        {"name": "b", "url": "http://10.0.0.9:8001", "activation": "IfIdle",
         "fallback": {"name": "c"}},
        {"name": "c", "url": "http://10.0.0.9:8002"}]})
    kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(router))
    spec = kubectl.json("get", "modelrouter", "r", "-n", namespace)["spec"]
    assert [b.get("fallback") for b in spec["backends"]] == [
        {"name": "b", "model": "bee"}, {"name": "c"}, None]


def test_valid_objects_get_the_defaults_spec_py_assumes(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    objects = [
        _obj("ModelServer", "s", _SERVER),
        _obj("ModelPool", "p", {"members": _MEMBERS}),
        _obj("ModelRouter", "r", {"backends": [_URL]}),
    ]
    kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )
    server = kubectl.json("get", "modelserver", "s", "-n", namespace)["spec"]
    assert server["runtime"] == "llamacpp" and server["port"] == 8080 and server["replicas"] == 1
    assert server["scratch"] is True
    assert server["resources"] == {"gpu": 1, "gpuResource": "nvidia.com/gpu"}
    pool = kubectl.json("get", "modelpool", "p", "-n", namespace)["spec"]
    assert (pool["swapPolicy"], pool["swapBudget"]) == ("sticky", "300s")
    assert pool["members"] == [{"name": "a", "priority": 0}, {"name": "b", "priority": 0}]
    router = kubectl.json("get", "modelrouter", "r", "-n", namespace)["spec"]
    assert router["routeStrategy"] == "BackendNameMatch"
    assert router["proxy"] == {
        "replicas": 1,
        "port": 8080,
        "responseHeaderTimeout": "600s",
        "maxHeldRequests": 1000,
        "heldStreamProgress": "Comment",
        "shutdownDelay": "5s",
        "shutdownGracePeriod": "25s",
    }
    names = kubectl("get", "mpool,ms,mrouter", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == sorted(
        ["modelpool.modelpool.dev/p", "modelserver.modelpool.dev/s", "modelrouter.modelpool.dev/r"]
    )
    columns = kubectl("get", "mpool", "p", "-n", namespace).stdout.split("\n")[0].split()
    assert columns == ["NAME", "RESIDENT", "PHASE", "POLICY", "RESIDENTS", "AGE"]
    # the singular name is not shadowed by a category
    assert kubectl("get", "modelpool", "p", "-n", namespace, "-o", "name").stdout.strip() == (
        "modelpool.modelpool.dev/p"
    )
    in_category = kubectl("get", "modelpool-all", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(in_category) == sorted(names)


def test_budgeted_and_exclusive_pools_are_admitted_and_parse_to_bytes(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    gi = 1024**3
    objects = [
        _obj("ModelServer", "s", {**_SERVER, "resources": {"gpuMemory": "20G"}}),
        # a member as large as the budget fits; one without a footprint is the reconciler's
        _obj("ModelPool", "budgeted", {"gpuMemory": "48Gi", "members": [
            {"name": "a", "gpuMemory": "8Gi"}, {"name": "b", "gpuMemory": 48 * gi},
            {"name": "s"}]}),
        _obj("ModelPool", "decimal", {"gpuMemory": 48 * 10**9, "members": [
            {"name": "a", "gpuMemory": "1.5Gi"}]}),
        _obj("ModelPool", "exclusive", {"members": _MEMBERS}),
    ]
    kubectl("create", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    server = ModelServerSpec.from_body(kubectl.json("get", "modelserver", "s", "-n", namespace))
    assert server.resources.gpu_memory == 20 * 10**9
    pools = {name: ModelPoolSpec.from_body(kubectl.json("get", "modelpool", name, "-n",
                                                        namespace))
             for name in ("budgeted", "decimal", "exclusive")}
    assert [(p.gpu_memory, [m.gpu_memory for m in p.members]) for p in pools.values()] == [
        (48 * gi, [8 * gi, 48 * gi, None]), (48 * 10**9, [3 * gi // 2]), (None, [None, None])]
    wide = kubectl("get", "mpool", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "RESIDENT", "PHASE", "POLICY", "RESIDENTS", "BUDGET",
                               "ROOM", "AGE"]
    start, end = wide[0].index("BUDGET"), wide[0].index("ROOM")  # empty cells print as blanks
    budgets = {line.split()[0]: line[start:end].strip() for line in wide[1:]}
    assert budgets == {"budgeted": "48Gi", "decimal": str(48 * 10**9), "exclusive": ""}


def _patch_status(kubectl: Kubectl, namespace: str, patch: list[dict[str, Any]]) -> Any:
    return kubectl(
        "patch",
        "modelpool",
        "p",
        "-n",
        namespace,
        "--subresource=status",
        "--type=json",
        "-p",
        json.dumps(patch),
        check=False,
    )


def test_pool_status_request_follows_the_contract(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(_obj("ModelPool", "p", {"members": _MEMBERS})),
    )
    request: dict[str, Any] = {
        "member": "a",
        "generation": 1,
        "requestedAt": "2026-11-30T10:00:05Z",
        "requestedBy": f"{namespace}/chat/chat-router-abc",
    }
    ok = _patch_status(
        kubectl, namespace, [{"op": "add", "path": "/status", "value": {"request": request}}]
    )
    assert ok.returncode == 0, ok.stderr
    withdraw: list[dict[str, Any]] = [
        {"op": "test", "path": "/status/request/generation", "value": 1},
        {
            "op": "replace",
            "path": "/status/request",
            "value": {**request, "member": None, "generation": 2},
        },
    ]
    ok = _patch_status(kubectl, namespace, withdraw)
    assert ok.returncode == 0, ok.stderr
    status = kubectl.json("get", "modelpool", "p", "-n", namespace)["status"]
    assert status["request"] == {**request, "member": None, "generation": 2}
    stale = _patch_status(kubectl, namespace, withdraw)  # generation is 2 now: the test fails
    assert stale.returncode != 0
    bad = _patch_status(
        kubectl,
        namespace,
        [{"op": "replace", "path": "/status/request/generation", "value": "three"}],
    )
    # The fields are named from the object (`status.request.generation`) or, by a 1.29 API
    # server, from the status (`request.generation`).
    assert bad.returncode != 0 and "request.generation: Invalid" in bad.stderr, bad.stderr
    phase = _patch_status(
        kubectl, namespace, [{"op": "add", "path": "/status/phase", "value": "Busy"}]
    )
    assert phase.returncode != 0 and "phase: Unsupported value" in phase.stderr, phase.stderr


def test_install_passes_a_server_side_dry_run(crds: None, kubectl: Kubectl) -> None:
    # Namespaced objects can only be dry-run into a namespace that exists; the base's own
    # Namespace is applied for real first, as the first apply of the install would.
    kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "namespace.yaml"))
    result = kubectl("apply", "--server-side", "--dry-run=server", "-k", str(ROOT))
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 11, result.stdout
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout


def test_examples_pass_admission(crds: None, kubectl: Kubectl, namespace: str) -> None:
    files = [str(ROOT / "examples" / f) for f in ("model-servers.yaml", "pool.yaml", "router.yaml")]
    args = [arg for f in files for arg in ("-f", f)]
    result = kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, *args)
    assert result.stdout.count("(server dry run)") == 4, result.stdout


def _in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["namespace"] = namespace
    for subject in obj.get("subjects", []):
        subject["namespace"] = namespace
    return obj


def test_a_claim_pool_gets_the_default_class_which_cannot_change(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    body = _obj("ModelPool", "claimed", {"members": [{"name": "a", "gpuMemory": "8Gi"}],
                                         "device": {"claim": {}}})
    kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    pool = ModelPoolSpec.from_body(kubectl.json("get", "modelpool", "claimed", "-n",
                                                namespace))
    assert pool.claim is not None and pool.claim.device_class_name == "gpu.nvidia.com"
    assert pool.budgeted and pool.gpu_memory is None
    patch = json.dumps({"spec": {"device": {"claim": {"deviceClassName": "gpu.amd.com"}}}})
    result = kubectl("patch", "modelpool", "claimed", "-n", namespace, "--type=merge",
                     "-p", patch, check=False)
    assert result.returncode != 0 and "is immutable" in result.stderr, result.stderr
    # removing the claim is a change of its own (the pool then shares by device plugin)
    kubectl("patch", "modelpool", "claimed", "-n", namespace, "--type=json",
            "-p", json.dumps([{"op": "remove", "path": "/spec/device/claim"}]))


def test_rendered_objects_are_accepted(crds: None, kubectl: Kubectl, namespace: str) -> None:
    renderer = Renderer()
    objects = [
        *renderer.model_server(GEMMA, replicas=1, owner_uid=None, pool="gpu0"),
        *renderer.model_server(QWEN, replicas=0, owner_uid=None, pool="gpu0"),
        *renderer.model_server(EMBED, replicas=2, owner_uid=None),
        *renderer.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None),
    ]
    text = yaml.safe_dump_all([_in_namespace(o, namespace) for o in objects])
    result = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=text)
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout


# Every toleration, node selector and env shape the Pod API accepts: what the schemas above
# refuse must not reach past these.
_TOLERATIONS = [
    {"operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "PreferNoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 30},
    {"key": "zone", "value": ""},
]
_NODE_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "pool": "", "gpu": "true"}


def test_the_widest_valid_specs_are_admitted_and_render_accepted_objects(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    server = _obj("ModelServer", "wide", {
        **_SERVER,
        "tolerations": _TOLERATIONS,
        "nodeSelector": _NODE_SELECTOR,
        "storage": {"pvc": "weights.gemma-3"},
        "scratch": False,
        "resources": {"gpu": 1, "gpuResource": "example.com/tpu-v5", "cpu": "500m",
                      "memory": "1e9"},
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "my.setting-1", "value": ""},
            {"name": "POD", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TEAM", "valueFrom": {
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['team']"}}},
            {"name": "MEM", "valueFrom": {
                "resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a.b_c"}}},
            {"name": "TOKEN", "valueFrom": {
                "secretKeyRef": {"name": "hf", "key": "token", "optional": True}}},
        ],
    })
    router = _obj("ModelRouter", "wide", {
        "backends": [{"name": "wide", "modelServerRef": {"name": "wide"}}],
        "proxy": {"tolerations": _TOLERATIONS, "nodeSelector": _NODE_SELECTOR,
                  "apiKeySecret": {"name": "router-keys", "key": "keys.txt"},
                  "shutdownDelay": "0s", "shutdownGracePeriod": "1h",
                  "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                "limits": {"cpu": 1, "memory": "+128Mi",
                                           "ephemeral-storage": "1Gi"}}},
    })
    admitted = []
    for manifest in (server, router):
        result = kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                         input=json.dumps(manifest))
        admitted.append(json.loads(result.stdout))
    ms = ModelServerSpec.from_body(admitted[0])
    renderer = Renderer()
    objects = [
        *renderer.model_server(ms, replicas=1, owner_uid=None),
        *renderer.router(ModelRouterSpec.from_body(admitted[1]), servers={"wide": ms}, pools=[],
                         owner_uid=None),
    ]
    text = yaml.safe_dump_all([_in_namespace(o, namespace) for o in objects])
    result = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=text)
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout
    (deployment,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "wide"
    ]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {e["name"] for e in env} >= {"POD", "TEAM", "MEM", "CFG", "TOKEN"}
    assert [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]] == ["models"]


def _pod(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": deployment["metadata"]["name"],
            "namespace": namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }


def test_rendered_pods_pass_the_restricted_level(
    crds: None, kubectl: Kubectl, namespace: str
) -> None:
    kubectl(
        "label",
        "namespace",
        namespace,
        "--overwrite",
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    renderer = Renderer()
    router = renderer.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    (account,) = [o for o in router if o["kind"] == "ServiceAccount"]
    kubectl("create", "-f", "-", input=json.dumps(_in_namespace(account, namespace)))
    deployments = [
        o
        for o in (
            *renderer.model_server(QWEN, replicas=1, owner_uid=None),
            *renderer.model_server(EMBED, replicas=1, owner_uid=None),
            *router,
        )
        if o["kind"] == "Deployment"
    ]
    assert len(deployments) == 3
    for deploy in deployments:
        pod = json.dumps(_pod(deploy, namespace))
        result = kubectl("create", "--dry-run=server", "-f", "-", input=pod, check=False)
        assert result.returncode == 0, f"{deploy['metadata']['name']}: {result.stderr}"
    # The control: a hostPath volume (GEMMA's weights) is refused at this level.
    (hostpath,) = [
        o
        for o in renderer.model_server(GEMMA, replicas=1, owner_uid=None)
        if o["kind"] == "Deployment"
    ]
    refused = kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps(_pod(hostpath, namespace)),
        check=False,
    )
    assert refused.returncode != 0
    assert "restricted" in refused.stderr and "hostPath" in refused.stderr, refused.stderr


def test_a_kv_cache_on_a_claim_is_admitted_with_its_defaults(
    kubectl: Kubectl, namespace: str
) -> None:
    obj = _obj("ModelServer", "s", {**_SERVER, "kvCache": {"persist": True, "pvc": "kv"}})
    kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))
    stored = kubectl.json("get", "modelserver", "s", "-n", namespace)
    assert stored["spec"]["kvCache"] == {"persist": True, "pvc": "kv", "saveTimeout": "10s",
                                         "maxAge": "24h"}
    spec = ModelServerSpec.from_body(stored)
    assert spec.kv_cache is not None and spec.kv_cache.pvc == "kv"
