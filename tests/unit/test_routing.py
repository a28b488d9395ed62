"""Routing tables: which backend a `model` reaches under each strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.auth import parse_keys
from sidecar.config import parse_config
from sidecar.routing import build_routes

pytestmark = pytest.mark.unit


def _config(**overrides: Any) -> dict[str, Any]:
    def backend(name: str, *aliases: str) -> dict[str, Any]:
        return {"name": name, "aliases": list(aliases), "url": f"http://127.0.0.1/{name}"}

    raw: dict[str, Any] = {
        "router": {"namespace": "n", "name": "r"},
        "responseHeaderTimeoutSeconds": 10,
        "maxHeldRequests": 10,
        "backends": [backend("coder", "qwen", "q"), backend("gemma", "g"), backend("x", "coder")],
    }
    raw.update(overrides)
    return raw


@pytest.mark.parametrize(
    ("overrides", "model", "expected"),
    [
        ({}, "coder", "coder"),
        ({}, "qwen", "coder"),
        ({}, "q", "coder"),
        ({}, "gemma", "gemma"),
        ({}, "g", "gemma"),
        ({}, "nope", None),
        ({}, "Coder", None),  # names are exact
        ({"defaultRoute": "gemma"}, "nope", "gemma"),
        ({"defaultRoute": "gemma"}, "coder", "coder"),
        ({"defaultRoute": "g"}, "nope", "gemma"),  # an alias may name the default
        ({"defaultRoute": "missing"}, "nope", None),
        ({"routeStrategy": "Static", "defaultRoute": "gemma"}, "coder", "gemma"),
        ({"routeStrategy": "Static", "defaultRoute": "gemma"}, "nope", "gemma"),
        ({"routeStrategy": "Static"}, "coder", None),
        ({"routeStrategy": "BackendNameMatch"}, "x", "x"),
    ],
)
def test_resolve(overrides: dict[str, Any], model: str, expected: str | None) -> None:
    backend = build_routes(parse_config(_config(**overrides))).resolve(model)
    assert (backend.name if backend else None) == expected


def test_a_name_wins_over_another_backends_alias() -> None:
    # Backend "x" declares alias "coder"; the backend named coder keeps the name.
    routes = build_routes(parse_config(_config()))
    assert routes.resolve("coder").name == "coder"  # type: ignore[union-attr]


def test_names_lists_every_name_then_alias_once() -> None:
    names = [(n, b.name) for n, b in build_routes(parse_config(_config())).names()]
    assert names == [
        ("coder", "coder"),
        ("gemma", "gemma"),
        ("x", "x"),
        ("qwen", "coder"),
        ("q", "coder"),
        ("g", "gemma"),
    ]


@pytest.mark.parametrize(
    ("keys", "header", "allowed"),
    [
        ("", None, True),
        ("", "Bearer anything", True),
        ("k1\nk2\n", None, False),
        ("k1\nk2\n", "Bearer k1", True),
        ("k1\nk2\n", "bearer k2", True),
        ("k1\nk2\n", "BEARER  k2 ", True),
        ("k1\nk2\n", "Bearer k3", False),
        ("k1\nk2\n", "Bearer ", False),
        ("k1\nk2\n", "Basic k1", False),
        ("k1\nk2\n", "k1", False),
        ("# comment\n\n  k1  \n", "Bearer k1", True),
        ("# comment\n", "Bearer # comment", True),  # only comments: no keys, open
    ],
)
def test_api_keys(keys: str, header: str | None, allowed: bool) -> None:
    assert parse_keys(keys).allows(header) is allowed


SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"


def test_routing_and_auth_are_pure() -> None:
    for module in ("routing.py", "auth.py"):
        source = (SIDECAR / module).read_text()
        assert "import aiohttp" not in source and "from aiohttp" not in source, module
        assert "kr8s" not in source, module


def test_only_upstream_makes_http_calls() -> None:
    callers = sorted(
        p.relative_to(SIDECAR).as_posix()
        for p in SIDECAR.rglob("*.py")
        if any(
            call in p.read_text()
            for call in ("ClientSession(", "aiohttp.request(", "create_connection(")
        )
    )
    assert callers == ["http/client.py"]
