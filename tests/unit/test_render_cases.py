"""Specs shared by the rendering tests (no tests of its own): the example pool, a standalone
server and a router of plain URLs."""

from __future__ import annotations

from typing import Any

from reconciler.spec import ModelPoolSpec, ModelRouterSpec, ModelServerSpec


def body(kind: str, name: str, spec: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "demo"}
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": "modelpool.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


GEMMA = ModelServerSpec.from_body(
    body(
        "ModelServer",
        "gemma",
        {
            "runtime": "llamacpp",
            "image": "ghcr.io/ggml-org/llama.cpp:server-cuda",
            "model": "/models/gemma-3-4b-it-Q4_K_M.gguf",
            "args": ["--alias", "gemma", "--ctx-size", "8192"],
            "env": [{"name": "LLAMA_ARG_THREADS", "value": "8"}],
            "resources": {"memory": "8Gi"},
            "storage": {"hostPath": "/var/lib/modelpool/models"},
        },
        uid="uid-gemma",
    )
)

QWEN = ModelServerSpec.from_body(
    body(
        "ModelServer",
        "qwen",
        {
            "runtime": "vllm",
            "image": "vllm/vllm-openai:v0.11.0",
            "model": "/weights/Qwen2.5-1.5B-Instruct",
            "args": ["--max-model-len", "8192"],
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
            ],
            "port": 8000,
            "resources": {"gpu": 2, "gpuResource": "amd.com/gpu", "cpu": "4", "memory": "16Gi"},
            "storage": {"pvc": "weights", "mountPath": "/weights"},
            "nodeSelector": {"gpu.example/class": "a100"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        uid="uid-qwen",
    )
)

EMBED = ModelServerSpec.from_body(
    body(
        "ModelServer",
        "embed",
        {
            "runtime": "generic",
            "image": "ghcr.io/example/embedder:1.2",
            "args": ["serve", "--listen", ":9000"],
            "port": 9000,
            "resources": {"gpu": 0, "cpu": 2},
            "replicas": 2,
        },
    )
)

POOL = ModelPoolSpec.from_body(
    body(
        "ModelPool",
        "gpu0",
        {
            "members": [{"name": "gemma"}, {"name": "qwen", "priority": 1}],
            "default": "gemma",
            "swapPolicy": "fair",
            "swapBudget": "5m",
            "minResidency": "30s",
            "maxWait": "1m30s",
        },
        uid="uid-pool",
    )
)

CHAT = ModelRouterSpec.from_body(
    body(
        "ModelRouter",
        "chat",
        {
            "backends": [
                {"name": "gemma", "modelServerRef": {"name": "gemma"}, "aliases": ["gemma-3"]},
                {"name": "qwen", "modelServerRef": {"name": "qwen"}},
                {"name": "embed", "modelServerRef": {"name": "embed"}},
                {"name": "external", "url": "http://10.0.0.9:8000"},
            ],
            "defaultRoute": "gemma",
            "proxy": {
                "replicas": 2,
                "nodeSelector": {"role": "edge"},
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "port": 80,
                "responseHeaderTimeout": "90s",
                "maxHeldRequests": 50,
            },
        },
        uid="uid-chat",
    )
)

EDGE = ModelRouterSpec.from_body(
    body(
        "ModelRouter",
        "edge",
        {
            "backends": [
                {"name": "big", "url": "https://llm.example.com/v1"},
                {"name": "small", "url": "http://10.0.0.7:8080", "aliases": ["tiny"]},
            ],
            "defaultRoute": "small",
            "routeStrategy": "Static",
        },
    )
)

SERVERS = {s.name: s for s in (GEMMA, QWEN, EMBED)}
