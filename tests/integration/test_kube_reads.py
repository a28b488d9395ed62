"""The harness's in-process reads (e2e/kube_reads.py) print what kubectl prints, judged by
kubectl itself on the real API server: objects, lists by label and by field, several names,
CRDs and custom resources, managed fields only when asked, and kubectl's refusals."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from e2e import kube_reads
from e2e.harness import apply
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.integration


def by_kubectl(kubectl: Kubectl, *args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def same(kubectl: Kubectl, *args: str) -> Any:
    reads = kube_reads.Reads(kubectl.kubeconfig)
    answered = reads.get(args)
    assert answered is not None, f"{args} left to kubectl"
    assert answered == by_kubectl(kubectl, *args), args
    return answered


def config_map(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels}, "data": {"k": name}}


def test_reads_print_what_kubectl_prints(kubectl: Kubectl, namespace: str) -> None:
    apply(kubectl, namespace, config_map("one", {"app": "a"}), config_map("two", {"app": "b"}))

    one = same(kubectl, "get", "configmap", "one", "-n", namespace)
    assert one["data"] == {"k": "one"} and "managedFields" not in one["metadata"]
    assert "managedFields" in same(kubectl, "get", "cm", "one", "-n", namespace,
                                   "--show-managed-fields")["metadata"]
    labelled = same(kubectl, "get", "configmaps", "-n", namespace, "-l", "app=b")
    assert [i["metadata"]["name"] for i in labelled["items"]] == ["two"]
    assert labelled["items"][0]["kind"] == "ConfigMap"
    same(kubectl, "get", "configmaps", "-n", namespace, "--field-selector",
         "metadata.name=one")
    both = same(kubectl, "get", "configmap", "two", "one", "-n", namespace)
    assert [i["metadata"]["name"] for i in both["items"]] == ["two", "one"]
    same(kubectl, "get", "serviceaccount", "default", f"--namespace={namespace}")
    same(kubectl, "get", "namespace", namespace)
    same(kubectl, "get", "events", "-n", namespace)


def test_custom_resources_installed_after_the_first_read_are_found(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    reads = kube_reads.Reads(kubectl.kubeconfig)
    assert reads.get(("get", "namespace", namespace)) is not None  # discovery read once
    plural = f"gizmos{namespace.replace('-', '')[-6:]}"
    group = "reads.test.modelpool.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": plural[:-1], "kind": "Gizmo",
                           "shortNames": [f"gz{plural[-6:]}"]},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": True}}}]}}
    (tmp_path / "crd.json").write_text(json.dumps(crd))
    kubectl("apply", "--server-side", "-f", str(tmp_path / "crd.json"))
    try:
        kubectl("wait", "--for=condition=Established", f"crd/{plural}.{group}",
                "--timeout=60s")
        apply(kubectl, namespace, {"apiVersion": f"{group}/v1", "kind": "Gizmo",
                                   "metadata": {"name": "g"}, "spec": {"size": 3}})
        for name in (plural, plural[:-1], f"{plural}.{group}", f"gz{plural[-6:]}"):
            got = reads.get(("get", name, "g", "-n", namespace))
            assert got == by_kubectl(kubectl, "get", name, "g", "-n", namespace), name
            assert got["spec"] == {"size": 3}
        same(kubectl, "get", "crd", f"{plural}.{group}")
    finally:
        kubectl("delete", "crd", f"{plural}.{group}", "--wait=false")


def test_a_refusal_reads_as_kubectl_says_it(kubectl: Kubectl, namespace: str) -> None:
    refused = kubectl("get", "configmap", "absent", "-n", namespace, "-o", "json", check=False)
    assert refused.returncode != 0
    with pytest.raises(AssertionError) as raised:
        kubectl.json("get", "configmap", "absent", "-n", namespace)
    assert "NotFound" in str(raised.value)
    assert 'configmaps "absent" not found' in refused.stderr
    assert 'configmaps "absent" not found' in str(raised.value)


@pytest.mark.parametrize("args", [
    ("get", "pods", "-A"),
    ("get", "configmaps,secrets", "-n", "default"),
    ("get", "configmap/one", "-n", "default"),
    ("apply", "-f", "x.yaml"),
    ("get", "no-such-resource-kind"),
])
def test_other_shapes_are_left_to_kubectl(kubectl: Kubectl, args: tuple[str, ...]) -> None:
    assert kube_reads.Reads(kubectl.kubeconfig).get(args) is None


def test_a_namespace_made_and_deleted_in_process_is_what_kubectl_sees(kubectl: Kubectl) -> None:
    """The namespace fixture's two writes: kubectl reads back what `create` made, a second
    create is refused as kubectl's would be, `delete` sets the namespace terminating, and a
    delete of one that never was says so."""
    name = f"t-reads-made-{secrets.token_hex(3)}"
    manifest = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {"modelpool.dev/test": "true"}}}
    kubectl.create_namespace(manifest)
    try:
        seen = by_kubectl(kubectl, "get", "namespace", name)
        assert seen["metadata"]["labels"]["modelpool.dev/test"] == "true"
        with pytest.raises(AssertionError, match="AlreadyExists"):
            kubectl.create_namespace(manifest)
        assert kubectl.json_or_none("get", "serviceaccount", "absent", "-n", name) is None
    finally:
        assert kube_reads.Reads(kubectl.kubeconfig).delete(f"/api/v1/namespaces/{name}")
    gone = kubectl.json_or_none("get", "namespace", name)
    assert gone is None or gone["metadata"].get("deletionTimestamp"), gone
    assert not kube_reads.Reads(kubectl.kubeconfig).delete(
        f"/api/v1/namespaces/{name}-never-made")
