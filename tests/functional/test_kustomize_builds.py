"""The base install and every overlay, built by kubectl's own kustomize (a subprocess)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_manifests import BASE_OBJECTS, ROOT, _find

pytestmark = pytest.mark.functional

KUBECTL = shutil.which("kubectl")


def _kustomize(path: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None, "kubectl is needed to build the kustomizations"
    out = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]



def test_base_is_a_complete_install() -> None:
    objects = _kustomize(ROOT)
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} == BASE_OBJECTS
    deploy = _find(objects, "Deployment", "modelpool-reconciler")
    assert deploy["spec"]["replicas"] == 1


def test_production_overlay() -> None:
    objects = _kustomize(ROOT / "overlays" / "production")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert kinds == BASE_OBJECTS | {
        ("PodDisruptionBudget", "modelpool-reconciler"),
        ("ServiceMonitor", "modelpool-reconciler"),
        ("PodMonitor", "modelpool-routers"),
        ("ConfigMap", "modelpool-grafana-dashboard"),
    }
    deploy = _find(objects, "Deployment", "modelpool-reconciler")
    assert deploy["spec"]["replicas"] == 2
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert container["args"] == ["run", "--leader-elect"]  # the patch kept the base's fields
    pdb = _find(objects, "PodDisruptionBudget", "modelpool-reconciler")
    assert pdb["spec"]["minAvailable"] == 1
    monitor = _find(objects, "ServiceMonitor", "modelpool-reconciler")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = _find(objects, "Service", "modelpool-reconciler-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # the reconciler's `namespace` label is the pool's: kept, or the dashboard's filter fails
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    routers = _find(objects, "PodMonitor", "modelpool-routers")
    assert routers["spec"]["namespaceSelector"] == {"any": True}
    (expression,) = routers["spec"]["selector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("modelpool.dev/router", "Exists")
    router_template = (ROOT / "templates" / "router" / "deployment.yaml.j2").read_text()
    port = routers["spec"]["podMetricsEndpoints"][0]["port"]
    assert f"- name: {port}\n" in router_template


@pytest.mark.parametrize(("overlay", "policy"), [("kind", "IfNotPresent"), ("local", "Never")])
def test_image_overlays(overlay: str, policy: str) -> None:
    objects = _kustomize(ROOT / "overlays" / overlay)
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} == BASE_OBJECTS
    deploy = _find(objects, "Deployment", "modelpool-reconciler")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/modelpool/modelpool:0.1.0"
    assert container["imagePullPolicy"] == policy


def test_examples_build() -> None:
    objects = _kustomize(ROOT / "examples")
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ModelPool", "ModelRouter", "ModelServer", "ModelServer", "Namespace"]
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        "modelpool-demo"
    }


def test_the_testbed_examples_differ_from_the_examples_only_in_what_runs_here() -> None:
    """overlays/examples-testbed: the same pool and router; gemma the real llama-server image
    with a generated model, qwen the fake in vLLM mode, no hostPath, namespace restricted."""
    base = {(o["kind"], o["metadata"]["name"]): o for o in _kustomize(ROOT / "examples")}
    variant = {(o["kind"], o["metadata"]["name"]): o
               for o in _kustomize(ROOT / "overlays" / "examples-testbed")}
    assert variant.keys() == base.keys()
    for key in (("ModelPool", "gpu0"), ("ModelRouter", "chat")):
        assert variant[key] == base[key]
    gemma, qwen = variant["ModelServer", "gemma"]["spec"], variant["ModelServer", "qwen"]["spec"]
    assert (gemma["runtime"], gemma["image"]) == ("llamacpp", "modelpool/llama-server:e2e")
    assert gemma["model"] == "/models/gemma.gguf" and gemma["args"][:2] == ["--alias", "gemma"]
    assert (qwen["runtime"], qwen["image"]) == ("vllm", "modelpool/fake-model:e2e")
    assert qwen["args"][:2] == ["--mode", "vllm"]
    assert "storage" not in gemma and "storage" not in qwen
    labels = variant["Namespace", "modelpool-demo"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
