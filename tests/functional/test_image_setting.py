"""One kustomize `images:` entry moves the reconciler and every router it renders.

A kustomization of a user's own lists the base and renames its image, as someone installing
from their registry would; kubectl's kustomize builds it, and the reconciler's settings built
from the Deployment it prints render a router on that registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.render import Renderer
from reconciler.settings import parse
from reconciler.spec import DEFAULT_ROUTER_IMAGE
from tests.unit.test_manifests import ROOT, _find
from tests.unit.test_render_cases import CHAT, POOL, SERVERS

pytestmark = pytest.mark.functional

KUBECTL = shutil.which("kubectl")
DIGEST = "sha256:" + "0123456789abcdef" * 4


def _build(tmp_path: Path, base: Path, entry: dict[str, str]) -> list[dict[str, Any]]:
    assert KUBECTL is not None, "kubectl is needed to build the kustomizations"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, mine)],
        "images": [{"name": DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[0], **entry}],
    }))
    out = subprocess.run([KUBECTL, "kustomize", str(mine)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _router_image(objects: list[dict[str, Any]]) -> tuple[str, str]:
    """The reconciler's image, and the image a router it renders runs."""
    deploy = _find(objects, "Deployment", "modelpool-reconciler")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = parse(container["args"][1:], env)
    rendered = Renderer(router_image=settings.router_image).router(
        CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    router = _find(rendered, "Deployment", "chat-router")
    (routed,) = router["spec"]["template"]["spec"]["containers"]
    return container["image"], routed["image"]


@pytest.mark.parametrize(
    ("entry", "image"),
    [
        ({"newName": "registry.example.com/team/modelpool", "newTag": "0.2.0"},
         "registry.example.com/team/modelpool:0.2.0"),
        ({"newName": "localhost:5000/modelpool", "digest": DIGEST},
         f"localhost:5000/modelpool@{DIGEST}"),
    ],
)
@pytest.mark.parametrize("base", [ROOT, ROOT / "overlays" / "production"],
                         ids=["base", "production"])
def test_one_entry_names_the_registry_for_reconciler_and_routers(
    tmp_path: Path, base: Path, entry: dict[str, str], image: str
) -> None:
    objects = _build(tmp_path, base, entry)
    assert _router_image(objects) == (image, image)
    # Nothing else names the old image.
    assert DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[0] + ":" not in yaml.safe_dump_all(objects)
