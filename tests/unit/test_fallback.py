"""Fall through instead of waiting (sidecar.fallback): which backend answers, by table;
the router's config and the reconciler's spec both refuse a fallback that names nothing
or comes back on itself."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from reconciler.router_config import router_config
from reconciler.spec import ModelRouterSpec, SpecError
from sidecar import fallback
from sidecar.config import BackendConfig, ConfigError, Fallback, parse_config
from tests.functional.proxy_support import config_json, url_backend
from tests.unit.test_render_cases import body

pytestmark = pytest.mark.unit


def backend(name: str, activation: str | None = None, to: str | None = None,
            model: str | None = None, pool: str | None = "slot") -> dict[str, Any]:
    raw = url_backend(name, f"http://127.0.0.1:9/{name}", pool=pool)
    if activation is not None:
        raw["activation"] = activation
    if to is not None:
        raw["fallback"] = {"backend": to, "model": model}
    return raw


def choose(backends: list[dict[str, Any]], asked: str, resident: set[str],
           idle: bool = True) -> tuple[str, str | None]:
    config = parse_config(config_json(backends))
    start = config.backend(asked)
    assert start is not None
    chosen, model = fallback.choose(
        start, config,
        serves_now=lambda b: b.pool is None or b.name in resident,
        swap_can_start=lambda b: idle,
    )
    return chosen.name, model


@pytest.mark.parametrize(("backends", "asked", "resident", "idle", "answered"), [
    # Wait (the default) holds, fallback or not
    ([backend("big", to="small"), backend("small", pool=None)], "big", set(), False,
     ("big", None)),
    # Never: the fallback while not resident, the member once it is
    ([backend("big", "Never", "small"), backend("small", pool=None)], "big", set(), True,
     ("small", None)),
    ([backend("big", "Never", "small"), backend("small", pool=None)], "big", {"big"}, True,
     ("big", None)),
    # IfIdle: held when the swap can start at once, the fallback when it cannot
    ([backend("big", "IfIdle", "small"), backend("small", pool=None)], "big", set(), True,
     ("big", None)),
    ([backend("big", "IfIdle", "small"), backend("small", pool=None)], "big", set(), False,
     ("small", None)),
    # the fallback names the model to send it
    ([backend("big", "Never", "small", model="tiny"), backend("small", pool=None)], "big",
     set(), True, ("small", "tiny")),
    # a chain: big -> mid (not resident, Never) -> small
    ([backend("big", "Never", "mid"), backend("mid", "Never", "small"),
      backend("small", pool=None)], "big", set(), True, ("small", None)),
    # ... which stops at a member that is resident
    ([backend("big", "Never", "mid"), backend("mid", "Never", "small"),
      backend("small", pool=None)], "big", {"mid"}, True, ("mid", None)),
])
def test_which_backend_answers(backends: list[dict[str, Any]], asked: str, resident: set[str],
                               idle: bool, answered: tuple[str, str | None]) -> None:
    assert choose(backends, asked, resident, idle) == answered


def test_a_chain_that_meets_itself_stops_where_it_started() -> None:
    """The config parser refuses loops; should one slip through, choose still ends."""
    a = BackendConfig("a", (), None, None, None, "slot", "http://x", activation="Never",
                      fallback=Fallback("b"))
    b = BackendConfig("b", (), None, None, None, "slot", "http://y", activation="Never",
                      fallback=Fallback("a"))
    config = replace(parse_config(config_json([backend("a"), backend("b")])), backends=(a, b))
    chosen, _ = fallback.choose(a, config, lambda _: False, lambda _: False)
    assert chosen.name == "b"


def test_the_model_is_rewritten_only_in_the_body_it_names() -> None:
    original = json.dumps({"model": "big", "messages": [{"role": "user", "content": "hi"}],
                           "stream": True}).encode()
    assert json.loads(fallback.with_model(original, "tiny")) == {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize(("backends", "error"), [
    ([backend("a", "Never", "nowhere")], "fallback 'nowhere' is no backend"),
    ([backend("a", "Never", "b"), backend("b", "Never", "c"), backend("c", "Never", "a")],
     "backends fall back in a loop: a -> b -> c -> a"),
    ([backend("a", "Sometimes", None)], "activation must be one of Wait, IfIdle, Never"),
])
def test_the_router_config_refuses(backends: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config(config_json(backends))


def _router(backends: list[dict[str, Any]]) -> ModelRouterSpec:
    return ModelRouterSpec.from_body(body("ModelRouter", "chat", {"backends": backends}))


def test_the_spec_refuses_a_fallback_loop_and_a_fallback_to_nothing() -> None:
    with pytest.raises(SpecError, match=r"fall back in a loop: a -> b -> c -> a"):
        _router([{"name": "a", "url": "http://x", "activation": "Never", "fallback": {"name": "b"}},
                 {"name": "b", "url": "http://y", "activation": "Never", "fallback": {"name": "c"}},
                 {"name": "c", "url": "http://z", "fallback": {"name": "a"}}])
    with pytest.raises(SpecError, match=r"spec.backends\[0\].fallback.name 'd' must name"):
        _router([{"name": "a", "url": "http://x", "fallback": {"name": "d"}}])


def test_activation_and_fallback_reach_the_router() -> None:
    router = _router([
        {"name": "big", "url": "http://x", "activation": "IfIdle",
         "fallback": {"name": "small", "model": "tiny"}},
        {"name": "small", "url": "http://y"},
    ])
    raw = router_config(router, {}, [])
    assert raw["backends"][0]["activation"] == "IfIdle"
    assert raw["backends"][0]["fallback"] == {"backend": "small", "model": "tiny"}
    assert "activation" not in raw["backends"][1] and "fallback" not in raw["backends"][1]
    cfg = parse_config(raw)
    big = cfg.backend("big")
    assert big is not None and big.activation == "IfIdle"
    assert big.fallback is not None and (big.fallback.backend, big.fallback.model) == (
        "small", "tiny")
