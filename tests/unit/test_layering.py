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


# The router's layers, top to bottom: a module imports only from its own layer or those
# below it. `sidecar.http` (the HTTP/1.1 server and client) is the floor: it knows
# nothing of routing, pools or activation.
SIDECAR_LAYERS: list[tuple[str, frozenset[str]]] = [
    ("entry point", frozenset({"__main__"})),
    ("API", frozenset({"app"})),
    ("activation", frozenset({"activation"})),
    (
        "shells",
        frozenset({
            "kube", "reload", "event_reporter", "early_probes", "dead_endpoint", "relay",
            "held_stream", "errors", "dialects", "metrics", "pool_watches",
        }),
    ),
    (
        "decisions and ports",
        frozenset({
            "activator", "retry_after", "endpoints", "events", "config", "settings",
            "routing", "auth", "fallback", "target", "kube_port", "apis", "multipart",
        }),
    ),
    ("HTTP", frozenset({"http", "http.server", "http.messages", "http.client",
                        "http.headers", "http.slots", "http.probes"})),
]


def _modules(package: str) -> dict[str, Path]:
    """Each module of `package` by its name inside it ("" for the package itself)."""
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT / package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported_modules(path: Path, package: str, known: set[str]) -> set[str]:
    """The modules of `package` that `path` imports, by their names inside it."""
    names: set[str] = set()
    prefix = package + "."
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith(prefix))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and (node.module == package or node.module.startswith(prefix))
        ):
            for alias in node.names:  # `from sidecar.http import client`: a module
                module = f"{node.module}.{alias.name}"
                names.add(module if module.removeprefix(prefix) in known else node.module)
    return {n.removeprefix(prefix) for n in names if n != package}


def _sidecar_graph() -> dict[str, set[str]]:
    modules = _modules("sidecar")
    known = set(modules)
    return {
        name: _imported_modules(path, "sidecar", known) - {name}
        for name, path in modules.items()
        if name
    }


@pytest.mark.unit
def test_every_sidecar_module_has_a_layer() -> None:
    layered = set().union(*(members for _, members in SIDECAR_LAYERS))
    assert sorted(set(_sidecar_graph()) - layered) == []
    assert sorted(layered - set(_sidecar_graph())) == []  # no stale name either


@pytest.mark.unit
def test_sidecar_modules_never_import_upward() -> None:
    rank = {m: i for i, (_, members) in enumerate(SIDECAR_LAYERS) for m in members}
    upward = sorted(
        f"{module} ({SIDECAR_LAYERS[rank[module]][0]}) imports {imported} "
        f"({SIDECAR_LAYERS[rank[imported]][0]})"
        for module, imports in _sidecar_graph().items()
        for imported in imports
        if rank[imported] < rank[module]
    )
    assert upward == []


@pytest.mark.unit
def test_sidecar_http_imports_nothing_else_of_the_router() -> None:
    outside = sorted(
        f"{module} imports {imported}"
        for module, imports in _sidecar_graph().items()
        if module.split(".")[0] == "http"
        for imported in imports
        if imported.split(".")[0] != "http"
    )
    assert outside == []


@pytest.mark.unit
def test_sidecar_imports_have_no_cycle() -> None:
    graph = _sidecar_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module):], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


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
