"""The activator's layering, checked on the source: its decisions, and the port and the
answers its shell speaks in (`kube_port`, `target`), import nothing that waits or talks,
and `sidecar.kube` is the only sidecar module that imports kr8s."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"
PURE = (
    "activator.py", "retry_after.py", "endpoints.py", "events.py", "kube_port.py", "target.py",
)
IO = {"kr8s", "httpx", "aiohttp", "asyncio", "time", "socket", "os", "prometheus_client"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    assert _imports(SIDECAR / module) & IO == set()


def test_only_kube_imports_kr8s() -> None:
    importers = sorted(p.name for p in SIDECAR.rglob("*.py") if "kr8s" in _imports(p))
    assert importers == ["kube.py"]
