"""The image-to-program map of docs/contracts.md section 3."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from e2e.local.node_agent.images import image_repository, program_for

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "e2e" / "local" / "node_agent"


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("modelpool/fake-model", "modelpool/fake-model"),
        ("modelpool/fake-model:1.2", "modelpool/fake-model"),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda", "ggml-org/llama.cpp"),
        ("localhost:5000/modelpool/router:dev", "modelpool/router"),
        ("docker.io/vllm/vllm-openai:v0.6.0", "vllm/vllm-openai"),
        ("registry.example:5000/modelpool/reconciler@sha256:abc", "modelpool/reconciler"),
        ("modelpool/router:1@sha256:abc", "modelpool/router"),
        ("docker.io/library/busybox:1", "busybox"),
        ("busybox", "busybox"),
    ],
)
def test_repository_ignores_registry_tag_and_digest(image: str, repository: str) -> None:
    assert image_repository(image) == repository


@pytest.mark.parametrize(
    ("image", "program"),
    [
        ("modelpool/fake-model:latest", ("-m", "e2e.fake_model")),
        ("ghcr.io/ggml-org/llama.cpp:server", ("-m", "e2e.fake_model", "--mode", "llamacpp")),
        ("modelpool/llama-server:e2e", ("-m", "e2e.llama.serve")),
        ("vllm/vllm-openai:latest", ("-m", "e2e.fake_model", "--mode", "vllm")),
        ("example.com/modelpool/router:x", ("-m", "sidecar")),
        ("modelpool/reconciler", ("-m", "reconciler")),
        ("modelpool/testbed-client", ("-m", "e2e.local.node_agent.client")),
    ],
)
def test_known_images_map_to_programs(image: str, program: tuple[str, ...]) -> None:
    assert program_for(image) == program


@pytest.mark.parametrize(
    ("image", "command", "program"),
    [
        # The product's image: the reconciler is its entrypoint, the router a command.
        ("ghcr.io/modelpool/modelpool:0.1.0", (), ("-m", "reconciler")),
        ("ghcr.io/modelpool/modelpool:0.1.0", ("modelpool-router",), ("-m", "sidecar")),
        ("ghcr.io/modelpool/modelpool:0.1.0", ("modelpool-reconciler",), ("-m", "reconciler")),
        ("modelpool/router:e2e", ("/opt/modelpool/bin/modelpool-router",), ("-m", "sidecar")),
        ("vllm/vllm-openai:latest", ("python3", "-m", "vllm"), ("-m", "e2e.fake_model",
                                                                "--mode", "vllm")),
    ],
)
def test_a_product_command_picks_the_program(
    image: str, command: tuple[str, ...], program: tuple[str, ...]
) -> None:
    assert program_for(image, command) == program


@pytest.mark.parametrize("image", ["busybox", "nginx:1", "ggml-org/whisper.cpp", "modelpool"])
def test_unknown_images_have_no_program(image: str) -> None:
    assert program_for(image) is None


def test_only_the_kube_module_imports_kr8s() -> None:
    importers = []
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "kr8s" for name in names):
                importers.append(path.name)
    assert sorted(set(importers)) == ["kube.py"]
