"""The router config contract (docs/contracts.md section 1), held from both sides: the
reconciler renders the ConfigMap, the router's own parser loads it, and every field of the
specs arrives. The two packages never import each other; only this test sees both."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.render import Renderer
from reconciler.router_config import config_json, router_config
from reconciler.spec import ModelPoolSpec, ModelRouterSpec, ModelServerSpec, SpecError
from sidecar.config import RouterConfig, parse_config
from tests.unit.test_render_cases import (
    CHAT,
    EDGE,
    EMBED,
    GEMMA,
    POOL,
    QWEN,
    SERVERS,
    body,
)

pytestmark = pytest.mark.unit

CONTRACT_KEYS = {
    "version", "router", "routeStrategy", "defaultRoute", "responseHeaderTimeoutSeconds",
    "maxHeldRequests", "maxBodyBytes", "backends", "pools",
}
BACKEND_KEYS = {
    "name", "aliases", "modelServer", "service", "port", "pool", "url", "readinessPath",
}
POOL_KEYS = {
    "name", "members", "default", "swapPolicy", "swapBudgetSeconds", "maxWaitSeconds",
    "minResidencySeconds",
}


def _through_the_config_map() -> tuple[dict[str, Any], RouterConfig]:
    objects = Renderer().router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert list(cm["data"]) == ["config.json"]
    raw = json.loads(cm["data"]["config.json"])
    return raw, parse_config(raw)


def test_keys_are_exactly_the_contract() -> None:
    raw, _ = _through_the_config_map()
    assert set(raw) == CONTRACT_KEYS
    assert raw["version"] == 1
    assert all(set(b) == BACKEND_KEYS for b in raw["backends"])
    assert all(set(p) == POOL_KEYS for p in raw["pools"])


def test_every_field_reaches_the_router() -> None:
    _, cfg = _through_the_config_map()
    assert (cfg.namespace, cfg.name) == ("demo", "chat")
    assert cfg.route_strategy == "BackendNameMatch"
    assert cfg.default_route == "gemma"
    assert cfg.response_header_timeout_seconds == 90.0
    assert cfg.max_held_requests == 50
    assert cfg.max_body_bytes == 32 * 1024 * 1024
    assert [b.name for b in cfg.backends] == ["gemma", "qwen", "embed", "external"]

    gemma = cfg.backend("gemma")
    assert gemma is not None
    assert gemma.aliases == ("gemma-3",)
    assert (gemma.model_server, gemma.service, gemma.port) == ("gemma", "gemma", GEMMA.port)
    assert (gemma.pool, gemma.url) == ("gpu0", None)
    assert gemma.readiness_path == "/health"  # llamacpp

    qwen = cfg.backend("qwen")
    assert qwen is not None
    assert (qwen.model_server, qwen.service, qwen.port, qwen.pool) == ("qwen", "qwen", 8000, "gpu0")
    assert QWEN.port == 8000
    assert qwen.readiness_path == "/health"  # vllm

    embed = cfg.backend("embed")
    assert embed is not None
    assert (embed.service, embed.port, embed.pool) == ("embed", EMBED.port, None)
    assert embed.readiness_path is None  # generic without readinessPath: probed by TCP

    external = cfg.backend("external")
    assert external is not None
    assert external.url == "http://10.0.0.9:8000"
    assert (external.model_server, external.service, external.port, external.pool) == (
        None, None, None, None,
    )
    assert external.readiness_path is None

    (pool,) = cfg.pools
    assert pool.name == "gpu0"
    assert pool.members == ("gemma", "qwen")
    assert pool.default == "gemma"
    assert pool.swap_policy == "fair"
    assert pool.swap_budget_seconds == 300.0
    assert pool.max_wait_seconds == 90.0
    assert pool.min_residency_seconds == 30.0
    assert cfg.backend_for_member("qwen") == qwen


def test_router_of_urls_and_static_route() -> None:
    cfg = parse_config(json.loads(config_json(router_config(EDGE, {}, []))))
    assert cfg.route_strategy == "Static"
    assert cfg.default_route == "small"
    assert cfg.pools == ()
    assert [(b.name, b.url, b.aliases) for b in cfg.backends] == [
        ("big", "https://llm.example.com/v1", ()),
        ("small", "http://10.0.0.7:8080", ("tiny",)),
    ]
    assert cfg.response_header_timeout_seconds == 600.0
    assert cfg.max_held_requests == 1000


def test_only_fronted_pools_are_listed() -> None:
    elsewhere = ModelPoolSpec.from_body(body("ModelPool", "other", {"members": [{"name": "x"}]}))
    cfg = parse_config(router_config(CHAT, SERVERS, [elsewhere, POOL]))
    assert [p.name for p in cfg.pools] == ["gpu0"]


def test_fractional_durations_stay_fractional() -> None:
    router = ModelRouterSpec.from_body(
        body("ModelRouter", "r", {"backends": [{"name": "a", "url": "http://h"}],
                                  "proxy": {"responseHeaderTimeout": "1.5s"}})
    )
    raw = router_config(router, {}, [])
    assert raw["responseHeaderTimeoutSeconds"] == 1.5
    assert parse_config(raw).response_header_timeout_seconds == 1.5


def _probe_path(server: ModelServerSpec) -> str | None:
    objects = Renderer().model_server(server, replicas=0, owner_uid=None)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    probe = container["readinessProbe"]
    return probe["httpGet"]["path"] if "httpGet" in probe else None


@pytest.mark.parametrize("name", ["gemma", "qwen", "embed", "custom"])
def test_the_router_probes_the_path_the_kubelet_probes(name: str) -> None:
    custom = ModelServerSpec.from_body(
        body(
            "ModelServer",
            "custom",
            {"runtime": "generic", "image": "x/y:1", "readinessPath": "/ready"},
        )
    )
    servers = {**SERVERS, "custom": custom}
    router = ModelRouterSpec.from_body(
        body("ModelRouter", "r", {"backends": [{"name": name, "modelServerRef": {"name": name}}]})
    )
    (backend,) = parse_config(router_config(router, servers, [])).backends
    assert backend.readiness_path == _probe_path(servers[name])
    assert backend.readiness_path == {"embed": None, "custom": "/ready"}.get(name, "/health")


@pytest.mark.parametrize(("given", "written", "loaded"), [
    (None, None, "comment"), ("Comment", None, "comment"), ("Content", "content", "content"),
])
def test_held_stream_progress_reaches_the_router(
    given: str | None, written: str | None, loaded: str
) -> None:
    proxy: dict[str, Any] = {} if given is None else {"heldStreamProgress": given}
    router = ModelRouterSpec.from_body(body("ModelRouter", "chat", {
        "backends": [{"name": "x", "url": "http://10.0.0.7:8080"}], "proxy": proxy}))
    raw = router_config(router, {}, [])
    assert raw.get("heldStreamProgress") == written
    cfg = parse_config(json.loads(config_json(raw)))
    assert cfg.held_stream_progress == loaded
    assert cfg.held_stream_keepalive_seconds == 5.0


def test_an_unknown_held_stream_progress_is_refused() -> None:
    with pytest.raises(SpecError, match="heldStreamProgress must be one of Comment, Content"):
        ModelRouterSpec.from_body(body("ModelRouter", "chat", {
            "backends": [{"name": "x", "url": "http://10.0.0.7:8080"}],
            "proxy": {"heldStreamProgress": "Loud"}}))
