"""The layering contract: reconciler and sidecar never import each other; what they share
(telemetry, and kubecore for the API server) imports none of the programs; pure modules
import neither kr8s nor aiohttp; each program has one module that imports kr8s, a layer on
kubecore, whose own modules form no cycle. Checked on the source, without importing it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.unit
@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("reconciler", "sidecar"),
        ("sidecar", "reconciler"),
        ("telemetry", "reconciler"),
        ("telemetry", "sidecar"),
        ("telemetry", "kr8s"),
        ("telemetry", "kubecore"),
        ("kubecore", "reconciler"),
        ("kubecore", "sidecar"),
        ("kubecore", "e2e"),
        ("kubecore", "telemetry"),
    ],
)
def test_package_never_imports(package: str, forbidden: str) -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / package).rglob("*.py")
        if forbidden in _imports(p)
    ]
    assert offenders == []


# The one module of each program (and of kubecore) that imports kr8s.
KR8S_IMPORTERS = {
    "reconciler": ["reconciler/kube.py"],
    "sidecar": ["sidecar/kube.py"],
    "e2e": ["e2e/local/node_agent/kube.py"],
    "kubecore": ["kubecore/client.py"],
}
# kubecore's modules that neither talk nor wait on anything but what they are given.
KUBECORE_PURE = ("refusal.py", "watch.py", "pool_request.py")


@pytest.mark.unit
@pytest.mark.parametrize(("package", "importers"), sorted(KR8S_IMPORTERS.items()))
def test_one_module_imports_kr8s(package: str, importers: list[str]) -> None:
    found = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*.py") if "kr8s" in _imports(p)
    )
    assert found == importers


@pytest.mark.unit
@pytest.mark.parametrize("module", KUBECORE_PURE)
def test_kubecore_pure_modules_import_no_client(module: str) -> None:
    assert _imports(ROOT / "kubecore" / module) & {"kr8s", "httpx", "aiohttp"} == set()


def _kubecore_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "kubecore").glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "kubecore":
                    edges.update(f"kubecore.{alias.name}" for alias in node.names)
                elif node.module.startswith("kubecore."):
                    edges.add(node.module)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("kubecore."))
        graph[f"kubecore.{path.stem}"] = edges
    return graph


@pytest.mark.unit
def test_kubecore_modules_import_each_other_without_a_cycle() -> None:
    graph = _kubecore_graph()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
