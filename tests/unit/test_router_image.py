"""The routers' image follows the reconciler's: one setting, the image the base installs.

The base runs the product's one image as the reconciler and hands the same name to it as
MODELPOOL_ROUTER_IMAGE; every router it renders runs that image with the command
modelpool-router, unless its spec.proxy.image names another.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from typing import Any

import pytest

from reconciler.render import ROUTER_COMMAND, Renderer
from reconciler.settings import parse
from reconciler.spec import DEFAULT_ROUTER_IMAGE
from tests.unit.test_manifests import ROOT, _load
from tests.unit.test_render_cases import CHAT, POOL, SERVERS

pytestmark = pytest.mark.unit

ELSEWHERE = "registry.example.com:5000/team/modelpool:0.9.1"


def _router_container(renderer: Renderer, router: Any = CHAT) -> dict[str, Any]:
    objects = renderer.router(router, servers=SERVERS, pools=[POOL], owner_uid=None)
    (deploy,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _reconciler_container() -> dict[str, Any]:
    (deploy,) = _load(ROOT / "manifests" / "deployment.yaml")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_a_router_runs_the_reconcilers_router_image() -> None:
    container = _router_container(Renderer(router_image=ELSEWHERE))
    assert container["image"] == ELSEWHERE
    assert container["command"] == list(ROUTER_COMMAND) == ["modelpool-router"]


def test_spec_proxy_image_overrides_one_router() -> None:
    own = replace(CHAT, proxy=replace(CHAT.proxy, image="example.org/mine/modelpool:dev"))
    container = _router_container(Renderer(router_image=ELSEWHERE), own)
    assert container["image"] == "example.org/mine/modelpool:dev"
    assert container["command"] == ["modelpool-router"]


def test_the_setting_comes_from_the_environment_or_a_flag() -> None:
    assert parse([], {}).router_image == DEFAULT_ROUTER_IMAGE
    assert parse([], {"MODELPOOL_ROUTER_IMAGE": ELSEWHERE}).router_image == ELSEWHERE
    flag = parse(["--router-image", "x/modelpool:1"], {"MODELPOOL_ROUTER_IMAGE": ELSEWHERE})
    assert flag.router_image == "x/modelpool:1"


def test_the_base_hands_the_reconciler_its_own_image() -> None:
    container = _reconciler_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MODELPOOL_ROUTER_IMAGE"] == container["image"] == DEFAULT_ROUTER_IMAGE
    # The reconciler is the image's entrypoint: the base sets no command.
    assert "command" not in container


def test_the_image_carries_the_projects_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert DEFAULT_ROUTER_IMAGE.rsplit(":", 1)[1] == version


def test_the_routers_command_is_an_installed_program() -> None:
    # setup.py (or pyproject.toml) installs it: the product's image runs it by name.
    text = "\n".join(
        (ROOT / name).read_text() for name in ("pyproject.toml", "setup.py")
        if (ROOT / name).exists()
    )
    assert re.search(rf"{ROUTER_COMMAND[0]}\s*=\s*\"?sidecar\.__main__:main", text)
