"""Parsing the three kinds: CRD defaults applied, durations in seconds, errors that name
the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from reconciler.spec import (
    EnvVar,
    KvCache,
    ModelPoolSpec,
    ModelRouterSpec,
    ModelServerSpec,
    PoolMember,
    RouterBackend,
    SpecError,
    Storage,
    parse_duration,
)

pytestmark = pytest.mark.unit


def _body(kind: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "demo", **meta},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300s", 300.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("500ms", 0.5),
        ("2h3m4s", 7384.0),
        ("10us", 1e-5),
        ("0s", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "300", "5 m", "1d", "-1s", "s", "1.s", "abc"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(SpecError, match=re.escape("spec.swapBudget")):
        parse_duration(text, "spec.swapBudget")


def test_model_server_defaults() -> None:
    ms = ModelServerSpec.from_body(
        _body("ModelServer", {"image": "img", "model": "/m.gguf"}, uid="u", generation=3)
    )
    assert (ms.namespace, ms.name, ms.uid, ms.generation) == ("demo", "x", "u", 3)
    assert ms.runtime == "llamacpp"
    assert ms.port == 8080
    assert ms.resources.gpu == 1
    assert ms.resources.gpu_resource == "nvidia.com/gpu"
    assert ms.resources.cpu is None and ms.resources.memory is None
    assert ms.resources.gpu_memory is None
    assert ms.replicas == 1
    assert ms.storage is None and ms.idle is None and ms.readiness_path is None
    assert ms.args == () and ms.env == () and ms.tolerations == ()
    assert dict(ms.node_selector) == {}


def test_model_server_full() -> None:
    ms = ModelServerSpec.from_body(
        _body(
            "ModelServer",
            {
                "runtime": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "model": "Qwen/Qwen2.5",
                "args": ["--max-model-len", "4096"],
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                ],
                "port": 8000,
                "resources": {"gpu": 2, "gpuResource": "amd.com/gpu", "cpu": 4, "memory": "16Gi",
                              "gpuMemory": "1.5Gi"},
                "storage": {"pvc": "weights"},
                "nodeSelector": {"gpu": "a100"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "replicas": 3,
                "readinessPath": "/ready",
                "idle": {"metric": "vllm:num_requests_running", "threshold": 0},
            },
        )
    )
    assert ms.runtime == "vllm" and ms.port == 8000 and ms.replicas == 3
    assert ms.args == ("--max-model-len", "4096")
    assert ms.env[0] == EnvVar("A", "1")
    assert ms.env[1].to_k8s() == {
        "name": "T",
        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
    }
    assert (ms.resources.gpu, ms.resources.gpu_resource) == (2, "amd.com/gpu")
    assert (ms.resources.cpu, ms.resources.memory) == ("4", "16Gi")
    assert ms.resources.gpu_memory == 1536 * 1024**2
    assert ms.storage == Storage(mount_path="/models", pvc="weights")
    assert ms.idle is not None and ms.idle.metric == "vllm:num_requests_running"
    assert ms.readiness_path == "/ready"


def test_generic_needs_no_model() -> None:
    ms = ModelServerSpec.from_body(_body("ModelServer", {"runtime": "generic", "image": "i"}))
    assert ms.model is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": "m"}, "spec.image"),
        ({"image": "i"}, "spec.model"),
        ({"image": "i", "model": "m", "runtime": "ollama"}, "spec.runtime"),
        ({"image": "i", "model": "m", "port": 0}, "spec.port"),
        ({"image": "i", "model": "m", "port": 70000}, "spec.port"),
        ({"image": "i", "model": "m", "port": "8080"}, "spec.port"),
        ({"image": "i", "model": "m", "args": "--x"}, "spec.args"),
        ({"image": "i", "model": "m", "args": [1]}, "spec.args[0]"),
        ({"image": "i", "model": "m", "storage": {"mountPath": "/m"}}, "spec.storage"),
        ({"image": "i", "model": "m", "storage": {"pvc": "a", "hostPath": "/b"}}, "spec.storage"),
        ({"image": "i", "model": "m", "resources": {"gpu": -1}}, "spec.resources.gpu"),
        ({"image": "i", "model": "m", "env": [{"value": "v"}]}, "spec.env[0].name"),
        ({"image": "i", "model": "m", "replicas": True}, "spec.replicas"),
        ({"image": "i", "model": "m", "nodeSelector": {"a": 1}}, "spec.nodeSelector.a"),
        ({"image": "i", "model": "m", "resources": {"gpuMemory": "-8Gi"}},
         "spec.resources.gpuMemory must not be negative"),
        ({"image": "i", "model": "m", "resources": {"gpuMemory": "8 GB"}},
         "spec.resources.gpuMemory must be a quantity"),
        ({"image": "i", "model": "m", "resources": {"gpuMemory": 0}},
         "spec.resources.gpuMemory must be positive"),
    ],
)
def test_model_server_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=re.escape(field)):
        ModelServerSpec.from_body(_body("ModelServer", spec))


def test_metadata_errors() -> None:
    with pytest.raises(SpecError, match=re.escape("metadata.name")):
        ModelServerSpec.from_body({"kind": "ModelServer", "metadata": {}, "spec": {}})
    with pytest.raises(SpecError, match="kind must be ModelServer"):
        ModelServerSpec.from_body(_body("ModelPool", {"image": "i", "model": "m"}))
    with pytest.raises(SpecError, match="spec is required"):
        ModelPoolSpec.from_body({"kind": "ModelPool", "metadata": {"name": "p"}})


def test_namespace_defaults_to_default() -> None:
    body = _body("ModelServer", {"image": "i", "model": "m"})
    del body["metadata"]["namespace"]
    assert ModelServerSpec.from_body(body).namespace == "default"


def test_pool_defaults() -> None:
    pool = ModelPoolSpec.from_body(_body("ModelPool", {"members": [{"name": "a"}, {"name": "b"}]}))
    assert pool.members == (PoolMember("a"), PoolMember("b"))
    assert pool.member_names == ("a", "b")
    assert pool.default is None
    assert pool.swap_policy == "sticky"
    assert pool.swap_budget_seconds == 300.0
    assert pool.min_residency_seconds == 0.0
    assert pool.max_wait_seconds is None and pool.reclaim_after_seconds is None
    assert pool.gpu_memory is None  # an exclusive pool


def test_pool_full() -> None:
    pool = ModelPoolSpec.from_body(
        _body(
            "ModelPool",
            {
                "members": [{"name": "a", "priority": 5}, {"name": "b"}],
                "default": "a",
                "swapPolicy": "reclaim",
                "swapBudget": "2m",
                "minResidency": "30s",
                "maxWait": "1m30s",
                "reclaimAfter": "1h",
                "idleUnloadAfter": "15m",
            },
        )
    )
    assert pool.members[0] == PoolMember("a", 5)
    assert pool.default == "a" and pool.swap_policy == "reclaim"
    assert (pool.swap_budget_seconds, pool.min_residency_seconds) == (120.0, 30.0)
    assert (pool.max_wait_seconds, pool.reclaim_after_seconds) == (90.0, 3600.0)
    assert pool.idle_unload_after_seconds == 900.0


@pytest.mark.parametrize(
    ("budget", "entries", "expected"),
    [
        ("48Gi", [{"name": "a", "gpuMemory": "8Gi"}, {"name": "b"}],
         (48 * 1024**3, (8 * 1024**3, None))),
        (48 * 10**9, [{"name": "a", "gpuMemory": "20G"}, {"name": "b", "gpuMemory": 4096}],
         (48 * 10**9, (20 * 10**9, 4096))),
        # an entry as large as the budget fits
        ("16Gi", [{"name": "a", "gpuMemory": "16384Mi"}], (16 * 1024**3, (16 * 1024**3,))),
        # without a budget, footprints are kept and mean nothing yet
        (None, [{"name": "a", "gpuMemory": "8Gi"}], (None, (8 * 1024**3,))),
    ],
)
def test_pool_gpu_memory_in_bytes(budget: Any, entries: list[dict[str, Any]],
                                  expected: tuple[int | None, tuple[int | None, ...]]) -> None:
    spec: dict[str, Any] = {"members": entries}
    if budget is not None:
        spec["gpuMemory"] = budget
    pool = ModelPoolSpec.from_body(_body("ModelPool", spec))
    assert (pool.gpu_memory, tuple(m.gpu_memory for m in pool.members)) == expected
    assert pool.members[0] == PoolMember("a", 0, expected[1][0])


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.members"),
        ({"members": []}, "spec.members"),
        ({"members": [{"name": "a"}, {"name": "a"}]}, "spec.members"),
        ({"members": [{"priority": 1}]}, "spec.members[0].name"),
        ({"members": [{"name": "a"}], "default": "b"}, "spec.default"),
        ({"members": [{"name": "a"}], "swapPolicy": "random"}, "spec.swapPolicy"),
        ({"members": [{"name": "a"}], "swapBudget": "0s"}, "spec.swapBudget"),
        ({"members": [{"name": "a"}], "swapBudget": "5 minutes"}, "spec.swapBudget"),
        ({"members": [{"name": "a"}], "maxWait": 30}, "spec.maxWait"),
        ({"members": [{"name": "a"}], "swapPolicy": "fair"}, "spec.maxWait"),
        ({"members": [{"name": "a"}], "idleUnloadAfter": "0s"}, "spec.idleUnloadAfter"),
        (
            {"members": [{"name": "a"}], "swapPolicy": "reclaim", "default": "a"},
            "spec.reclaimAfter",
        ),
        ({"members": [{"name": "a"}], "gpuMemory": "-48Gi"}, "spec.gpuMemory must not be negative"),
        ({"members": [{"name": "a"}], "gpuMemory": "48 gigs"}, "spec.gpuMemory must be a quantity"),
        ({"members": [{"name": "a"}], "gpuMemory": "0"}, "spec.gpuMemory must be positive"),
        ({"members": [{"name": "a", "gpuMemory": "-1Gi"}]},
         "spec.members[0].gpuMemory must not be negative"),
        ({"members": [{"name": "a", "gpuMemory": "big"}], "gpuMemory": "48Gi"},
         "spec.members[0].gpuMemory must be a quantity"),
        ({"members": [{"name": "a", "gpuMemory": "8Gi"}, {"name": "b", "gpuMemory": "49Gi"}],
          "gpuMemory": "48Gi"},
         "spec.members[1].gpuMemory (49Gi) must not exceed spec.gpuMemory (48Gi)"),
    ],
)
def test_pool_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=re.escape(field)):
        ModelPoolSpec.from_body(_body("ModelPool", spec))


_URL = [{"name": "a", "url": "http://h"}]


def test_router_defaults() -> None:
    router = ModelRouterSpec.from_body(
        _body(
            "ModelRouter",
            {
                "backends": [
                    {"name": "a", "modelServerRef": {"name": "srv-a"}},
                    {"name": "ext", "url": "http://10.0.0.9:8000", "aliases": ["big"]},
                ]
            },
        )
    )
    assert router.backends == (
        RouterBackend("a", model_server_ref="srv-a"),
        RouterBackend("ext", url="http://10.0.0.9:8000", aliases=("big",)),
    )
    assert router.model_server_refs == ("srv-a",)
    assert router.default_route is None
    assert router.route_strategy == "BackendNameMatch"
    proxy = router.proxy
    # No image: the reconciler's router image (reconciler.settings), not a default of its own.
    assert (proxy.replicas, proxy.image, proxy.port) == (1, None, 8080)
    assert proxy.response_header_timeout_seconds == 600.0
    assert proxy.max_held_requests == 1000
    assert dict(proxy.node_selector) == {} and proxy.tolerations == ()
    assert dict(proxy.resources) == {}


def test_router_proxy_fields() -> None:
    router = ModelRouterSpec.from_body(
        _body(
            "ModelRouter",
            {
                "backends": [{"name": "a", "url": "http://h"}],
                "defaultRoute": "a",
                "routeStrategy": "Static",
                "proxy": {
                    "replicas": 3,
                    "image": "reg/modelpool/router:dev",
                    "nodeSelector": {"role": "edge"},
                    "tolerations": [{"key": "edge", "operator": "Exists"}],
                    "resources": {"requests": {"cpu": "100m"}},
                    "port": 80,
                    "responseHeaderTimeout": "15s",
                    "maxHeldRequests": 10,
                    "shutdownDelay": "0s",
                    "shutdownGracePeriod": "2m",
                },
            },
        )
    )
    p = router.proxy
    assert (p.replicas, p.image) == (3, "reg/modelpool/router:dev")
    assert (p.port, p.max_held_requests) == (80, 10)
    assert p.response_header_timeout_seconds == 15.0
    assert (p.shutdown_delay_seconds, p.shutdown_grace_period_seconds) == (0.0, 120.0)
    assert p.termination_grace_period_seconds == 125
    assert dict(p.node_selector) == {"role": "edge"}
    assert p.tolerations == ({"key": "edge", "operator": "Exists"},)
    assert dict(p.resources) == {"requests": {"cpu": "100m"}}
    assert router.route_strategy == "Static" and router.default_route == "a"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.backends"),
        ({"backends": [{"name": "a"}]}, "spec.backends[0]"),
        (
            {"backends": [{"name": "a", "url": "http://h", "modelServerRef": {"name": "s"}}]},
            "spec.backends[0]",
        ),
        ({"backends": [{"name": "a", "modelServerRef": {}}]}, "spec.backends[0]"),
        ({"backends": [{"url": "http://h"}]}, "spec.backends[0].name"),
        (
            {"backends": [{"name": "a", "url": "http://h"}, {"name": "a", "url": "http://i"}]},
            "spec.backends",
        ),
        ({"backends": _URL, "defaultRoute": "b"}, "spec.defaultRoute"),
        ({"backends": _URL, "routeStrategy": "Static"}, "spec.defaultRoute"),
        ({"backends": _URL, "routeStrategy": "Random"}, "spec.routeStrategy"),
        ({"backends": _URL, "proxy": {"port": 0}}, "spec.proxy.port"),
        (
            {"backends": _URL, "proxy": {"responseHeaderTimeout": "0s"}},
            "spec.proxy.responseHeaderTimeout",
        ),
        (
            {"backends": _URL, "proxy": {"maxHeldRequests": 0}},
            "spec.proxy.maxHeldRequests",
        ),
        ({"backends": _URL, "proxy": {"shutdownDelay": "-1s"}}, "spec.proxy.shutdownDelay"),
        ({"backends": _URL, "proxy": {"shutdownDelay": "61m"}}, "spec.proxy.shutdownDelay"),
        (
            {"backends": _URL, "proxy": {"shutdownGracePeriod": "0s"}},
            "spec.proxy.shutdownGracePeriod",
        ),
        (
            {"backends": _URL, "proxy": {"shutdownGracePeriod": "2h"}},
            "spec.proxy.shutdownGracePeriod",
        ),
    ],
)
def test_router_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=re.escape(field)):
        ModelRouterSpec.from_body(_body("ModelRouter", spec))


def test_kv_cache_parses_with_its_defaults() -> None:
    ms = ModelServerSpec.from_body(_body("ModelServer", {
        "image": "img", "model": "/m.gguf",
        "kvCache": {"persist": True, "pvc": "kv", "maxSize": "10Gi"}}))
    assert ms.kv_cache == KvCache(persist=True, pvc="kv", max_bytes=10 << 30,
                                  save_timeout=10.0, max_age=86400.0)
    assert ModelServerSpec.from_body(_body("ModelServer", {
        "image": "img", "model": "/m.gguf"})).kv_cache is None


@pytest.mark.parametrize(("spec", "why"), [
    ({"runtime": "vllm", "kvCache": {"persist": True, "pvc": "kv"}},
     "spec.kvCache needs runtime llamacpp"),
    ({"kvCache": {"persist": True}}, "spec.kvCache.persist needs spec.kvCache.pvc"),
    ({"kvCache": {"persist": True, "pvc": "kv", "maxSize": "-1"}}, "spec.kvCache.maxSize"),
    ({"kvCache": {"persist": True, "pvc": "kv", "saveTimeout": "0s"}},
     "spec.kvCache.saveTimeout"),
    ({"kvCache": {"persist": "yes", "pvc": "kv"}}, "spec.kvCache.persist"),
    ({"kvCache": {"persist": True, "pvc": "kv", "storageClassName": "fast"}},
     "names both pvc and storageClassName"),
    ({"kvCache": {"persist": True, "storageClassName": "fast", "storageSize": "0"}},
     "spec.kvCache.storageSize"),
])
def test_a_bad_kv_cache_names_what_is_wrong(spec: dict[str, Any], why: str) -> None:
    with pytest.raises(SpecError, match=re.escape(why)):
        ModelServerSpec.from_body(_body("ModelServer", {"image": "img", "model": "/m.gguf",
                                                        **spec}))
