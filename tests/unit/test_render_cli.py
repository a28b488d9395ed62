"""`python -m reconciler render`: the cold-start replica counts, owner references only with
a uid, errors that name the file and field, and the real entry point."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.render_cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [ROOT / "examples" / n for n in ("model-servers.yaml", "pool.yaml", "router.yaml")]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[Any], str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d], err


def _deployments(objects: list[dict[str, Any]]) -> dict[str, int]:
    return {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects
            if o["kind"] == "Deployment"}


@pytest.mark.unit
def test_examples_render_as_a_cold_start(capsys: pytest.CaptureFixture[str]) -> None:
    code, objects, err = _run(["-n", "demo", *map(str, EXAMPLES)], capsys)
    assert code == 0, err
    # the pool's default member at 1, the other member at 0, the router at its replicas
    assert _deployments(objects) == {"gemma": 1, "qwen": 0, "chat-router": 1}
    assert {o["metadata"]["namespace"] for o in objects} == {"demo"}
    assert [o["kind"] for o in objects].count("Role") == 1
    assert all("ownerReferences" not in o["metadata"] for o in objects)
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    config = json.loads(cm["data"]["config.json"])
    assert [p["name"] for p in config["pools"]] == ["gpu0"]


@pytest.mark.unit
def test_a_directory_stands_for_its_yaml_files(capsys: pytest.CaptureFixture[str]) -> None:
    code, objects, err = _run(["-n", "demo", str(ROOT / "examples")], capsys)
    assert code == 0, err
    # examples/ names its own namespace only through its kustomization (skipped here)
    assert _deployments(objects) == {"gemma": 1, "qwen": 0, "chat-router": 1}


@pytest.mark.unit
def test_the_render_word_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    code, objects, _ = _run(["render", str(EXAMPLES[0])], capsys)
    assert code == 0
    # not in a pool (none given): standalone servers at spec.replicas (default 1)
    assert _deployments(objects) == {"gemma": 1, "qwen": 1}
    assert {o["metadata"]["namespace"] for o in objects} == {"default"}


@pytest.mark.unit
def test_uids_give_owner_references_and_other_kinds_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}},
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelServer",
            "metadata": {"name": "solo", "namespace": "ns1", "uid": "u-1"},
            "spec": {"runtime": "generic", "image": "i", "replicas": 3},
        },
    ]
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, objects, _ = _run([str(path)], capsys)
    assert code == 0
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Deployment", "solo"), ("Service", "solo"), ("NetworkPolicy", "solo")
    ]
    assert _deployments(objects) == {"solo": 3}
    for o in objects:
        assert o["metadata"]["ownerReferences"][0]["uid"] == "u-1"


@pytest.mark.unit
def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(EXAMPLES[0].read_text()))
    code, objects, _ = _run(["-"], capsys)
    assert code == 0 and len(objects) == 6  # each server's Deployment, Service, NetworkPolicy


@pytest.mark.unit
def test_a_bad_spec_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelPool",
        "metadata": {"name": "p"}, "spec": {"members": [{"name": "a"}], "swapBudget": "soon"},
    }))
    code, objects, err = _run([str(path)], capsys)
    assert code == 1 and objects == []
    assert str(path) in err and "ModelPool p" in err and "spec.swapBudget" in err


@pytest.mark.unit
def test_a_router_without_its_servers_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run([str(EXAMPLES[2])], capsys)
    assert code == 1
    assert "ModelServer gemma" in err


@pytest.mark.unit
def test_a_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run([str(tmp_path / "nope.yaml")], capsys)
    assert code == 1 and "nope.yaml" in err


@pytest.mark.unit
def test_a_claim_pool_renders_its_claim_first_and_its_members_reference_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    member = {"runtime": "vllm", "image": "i", "model": "/m", "resources": {"gpu": 1}}
    docs = [
        {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelPool",
         "metadata": {"name": "gpu0", "namespace": "ns1"},
         "spec": {"members": [{"name": "qwen", "gpuMemory": "12Gi"}], "default": "qwen",
                  "gpuMemory": "48Gi", "device": {"claim": {}}}},
        {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelServer",
         "metadata": {"name": "qwen", "namespace": "ns1"}, "spec": member},
    ]
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, objects, _ = _run([str(path)], capsys)
    assert code == 0
    assert [(o["kind"], o["metadata"]["name"]) for o in objects][:2] == [
        ("ResourceClaim", "gpu0-gpu"), ("Deployment", "qwen")]
    pod = objects[1]["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "gpu0-gpu"}]
    args = pod["containers"][0]["args"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.2500"
