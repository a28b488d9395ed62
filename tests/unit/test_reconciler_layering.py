"""The reconciler's layering, checked on the source: the controller (watches, queue,
dispatch) sits on the three reconcilers of one kind each, which sit on what they share
(the context, the writes, the lookups, the caches); nothing below imports what is above
it, the modules import each other in no cycle, the pure ones import nothing that
waits or talks, and only the two adapters that call model servers (the idle probe, the
slot saves and restores) import aiohttp (`kube` talks to the API server through kr8s),
each on pure decisions alone; `kv_files`, the program of a member pod's kv-files
container, serves with aiohttp's server and calls nobody."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

RECONCILER = Path(__file__).resolve().parents[2] / "reconciler"
PURE = ("swap", "residency", "pool_status", "server_status", "router_status", "merge_patch",
        "objects", "conditions", "scheduling", "spec", "timefmt", "render", "router_config",
        "idle", "quantity", "footprints", "kv_cache", "kv_phases", "residency_status",
        "device_claim", "vllm_share")
IO = {"kr8s", "httpx", "aiohttp", "asyncio", "time", "socket", "os", "prometheus_client"}
# The modules that call model servers; `__main__` builds their session.
UPSTREAM = {"probes": {"idle", "swap"}, "kv_slots_io": {"kv_cache", "spec"}}
# Programs of their own that serve HTTP (aiohttp's server), on pure decisions alone.
SERVING = {"kv_files": {"kv_cache"}}
# Each layer imports only from the layers after it.
LAYERS = (
    {"__main__"},
    {"controller"},
    {"pools"},
    {"servers", "routers", "prewarm", "slot_saves"},
    {"kv_prune"},
    {"context"},
    {"writes", "lookups"},
    {"settling"},
    {"stores"},
)


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(the top-level packages `module` imports, the reconciler modules it imports)."""
    path = RECONCILER / f"{module}.py"
    packages: set[str] = set()
    siblings: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                packages.add(alias.name.split(".")[0])
                if alias.name.startswith("reconciler."):
                    siblings.add(alias.name.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            packages.add(node.module.split(".")[0])
            if node.module == "reconciler":
                siblings.update(alias.name for alias in node.names)
            elif node.module.startswith("reconciler."):
                siblings.add(node.module.split(".")[1])
    return packages, siblings


def _modules() -> list[str]:
    return sorted(p.stem for p in RECONCILER.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    packages, siblings = _imports(module)
    assert packages & IO == set()
    assert siblings - set(PURE) == set()


def test_only_the_upstream_adapters_call_model_servers() -> None:
    calling = {m for m in _modules() if m != "__main__" and "aiohttp" in _imports(m)[0]}
    assert calling == set(UPSTREAM) | set(SERVING)


@pytest.mark.parametrize("module", sorted(SERVING))
def test_a_serving_program_imports_aiohttps_server_alone_on_pure_decisions(
        module: str) -> None:
    path = RECONCILER / f"{module}.py"
    from_aiohttp = {alias.name for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module == "aiohttp"
                    for alias in node.names}
    assert from_aiohttp == {"web"}
    assert _imports(module)[1] == SERVING[module]


@pytest.mark.parametrize("module", sorted(UPSTREAM))
def test_an_upstream_adapter_sits_on_pure_decisions_alone(module: str) -> None:
    _, siblings = _imports(module)
    assert siblings == UPSTREAM[module]
    assert siblings <= set(PURE)


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_a_layer_imports_only_the_layers_below(layer: int) -> None:
    above = set().union(*LAYERS[:layer + 1])
    for module in LAYERS[layer]:
        _, siblings = _imports(module)
        assert siblings & above == set(), module


def test_the_reconciler_modules_import_each_other_in_no_cycle() -> None:
    graph = {m: _imports(m)[1] & set(_modules()) for m in _modules()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
