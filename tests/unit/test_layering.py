"""The layering contract: reconciler and sidecar never import each other, and what they
share (telemetry) imports neither of them nor kr8s; pure modules import neither kr8s nor
aiohttp. Checked on the source, without importing it."""

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
    ],
)
def test_package_never_imports(package: str, forbidden: str) -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / package).rglob("*.py")
        if forbidden in _imports(p)
    ]
    assert offenders == []
