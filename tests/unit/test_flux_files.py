"""What Flux syncs on kind (e2e/flux/sync.yaml) and what docs/operating.md tells a user to write,
checked where no cluster is needed: they are the same objects, and they name what this
repository holds. Flux itself judges them on kind (e2e/kind_tests/test_flux.py). And the
git server's reading of `git http-backend` output (git judges the server in
tests/functional/test_git_server.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.flux.git_server import parse_cgi_response

ROOT = Path(__file__).resolve().parents[2]
SYNC = ROOT / "e2e" / "flux" / "sync.yaml"
OWN_KINDS = {"ModelServer", "ModelPool", "ModelRouter"}

pytestmark = pytest.mark.unit


def _by_name(documents: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


def _readme_objects() -> dict[tuple[str, str], dict[str, Any]]:
    text = (ROOT / "docs" / "operating.md").read_text()
    section = text[text.index("## GitOps"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block, "the GitOps section of docs/operating.md has no yaml block"
    return _by_name(list(yaml.safe_load_all(block.group(1))))


def test_every_kustomization_waits_prunes_and_points_at_a_kustomization_here() -> None:
    objects = _by_name(list(yaml.safe_load_all(SYNC.read_text())))
    kustomizations = [o for (kind, _), o in objects.items() if kind == "Kustomization"]
    assert [k["metadata"]["name"] for k in kustomizations] == ["modelpool", "modelpool-examples"]
    for k in kustomizations:
        spec = k["spec"]
        assert spec["wait"] is True and spec["prune"] is True, k["metadata"]["name"]
        assert (ROOT / spec["path"] / "kustomization.yaml").is_file(), spec["path"]
        assert ("GitRepository", spec["sourceRef"]["name"]) in objects
    examples = objects["Kustomization", "modelpool-examples"]["spec"]
    assert examples["dependsOn"] == [{"name": "modelpool"}]
    checked = {c["kind"] for c in examples["healthCheckExprs"]}
    assert checked == OWN_KINDS


def test_the_readme_shows_the_objects_the_test_applies() -> None:
    """The same objects and specs; the README differs only in where the repository is and
    in syncing the base and examples/ themselves rather than their testbed variants."""
    synced = _by_name(list(yaml.safe_load_all(SYNC.read_text())))
    shown = _readme_objects()
    assert shown.keys() == synced.keys()
    allowed = {"GitRepository": {"url"}, "Kustomization": {"path"}}
    for key, obj in synced.items():
        differs = {
            field for field in obj["spec"].keys() | shown[key]["spec"].keys()
            if obj["spec"].get(field) != shown[key]["spec"].get(field)
        }
        assert differs <= allowed[key[0]], (key, differs)
    for (kind, _), obj in shown.items():
        if kind == "Kustomization":
            assert (ROOT / obj["spec"]["path"] / "kustomization.yaml").is_file()


def test_cgi_responses_are_split_into_status_headers_and_body() -> None:
    assert parse_cgi_response(b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nno") \
        == (404, [("Content-Type", "text/plain")], b"no")
    assert parse_cgi_response(b"Content-Type: application/x-git\n\n\x00\x01") \
        == (200, [("Content-Type", "application/x-git")], b"\x00\x01")
    with pytest.raises(ValueError):
        parse_cgi_response(b"no header block")
