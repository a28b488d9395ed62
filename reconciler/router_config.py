"""The router's config: the reconciler's half of docs/contracts.md section 1.

The router (sidecar) and the reconciler never import each other; this JSON is all they
share. It is built here from the specs, serialised once in a stable form, and the same text
goes into the ConfigMap and into the pod template's config hash, so any change rolls the
router. tests/unit/test_config_contract.py loads it with the router's own parser.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.spec import ModelPoolSpec, ModelRouterSpec, ModelServerSpec

CONFIG_VERSION = 1
CONFIG_KEY = "config.json"
MAX_BODY_BYTES = 32 * 1024 * 1024


class RenderError(ValueError):
    """The objects cannot be rendered as asked (a missing ModelServer, a member in two pools);
    the message names the object."""


class MissingServer(RenderError):
    """A backend refers to a ModelServer that does not exist (yet: objects applied together
    reach the reconciler in any order)."""


def _seconds(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def readiness_path(server: ModelServerSpec) -> str | None:
    """The HTTP path of `server`'s readiness probe, or None when it is probed by TCP. One
    source for both readers: the ModelServer template's readinessProbe, and the router,
    which probes a swap's target there before the kubelet marks it Ready."""
    if server.readiness_path:
        return server.readiness_path
    return "/health" if server.runtime in ("llamacpp", "vllm") else None


def pool_of(server: str, pools: Sequence[ModelPoolSpec]) -> ModelPoolSpec | None:
    """The pool that lists `server` as a member, or None; two pools are a RenderError."""
    owners = sorted((p for p in pools if server in p.member_names), key=lambda p: p.name)
    if len(owners) > 1:
        raise RenderError(
            f"ModelServer {server} is a member of more than one pool: "
            + ", ".join(p.name for p in owners)
        )
    return owners[0] if owners else None


def fronted_pools(
    router: ModelRouterSpec, pools: Sequence[ModelPoolSpec]
) -> list[ModelPoolSpec]:
    """The pools a router fronts: those holding one of its backends' ModelServers."""
    fronted: dict[str, ModelPoolSpec] = {}
    for ref in router.model_server_refs:
        pool = pool_of(ref, pools)
        if pool is not None:
            fronted.setdefault(pool.name, pool)
    return list(fronted.values())


def router_config(
    router: ModelRouterSpec,
    servers: Mapping[str, ModelServerSpec],
    pools: Sequence[ModelPoolSpec],
) -> dict[str, Any]:
    """The config document for `router`. `servers` maps ModelServer names to specs and
    `pools` are the ModelPools of the router's namespace; a backend naming a ModelServer
    that is not in `servers` is a RenderError."""
    backends: list[dict[str, Any]] = []
    for backend in router.backends:
        ref = backend.model_server_ref
        # written only when set: the router's defaults are Wait and no fallback
        extra: dict[str, Any] = {}
        if backend.activation != "Wait":
            extra["activation"] = backend.activation
        if backend.fallback is not None:
            extra["fallback"] = {"backend": backend.fallback, "model": backend.fallback_model}
        if ref is None:
            backends.append(
                {
                    "name": backend.name,
                    "aliases": list(backend.aliases),
                    "modelServer": None,
                    "service": None,
                    "port": None,
                    "pool": None,
                    "url": backend.url,
                    "readinessPath": None,
                    **extra,
                }
            )
            continue
        server = servers.get(ref)
        if server is None:
            raise MissingServer(
                f"ModelRouter {router.name} backend {backend.name} refers to ModelServer "
                f"{ref}, which does not exist in namespace {router.namespace}"
            )
        pool = pool_of(ref, pools)
        backends.append(
            {
                "name": backend.name,
                "aliases": list(backend.aliases),
                "modelServer": ref,
                "service": ref,
                "port": server.port,
                "pool": pool.name if pool else None,
                "url": None,
                "readinessPath": readiness_path(server),
                **extra,
            }
        )
    settings: dict[str, Any] = {}
    if router.proxy.held_stream_progress == "Content":  # the router's default is comments
        settings["heldStreamProgress"] = "content"
    return {
        **settings,
        "version": CONFIG_VERSION,
        "router": {"namespace": router.namespace, "name": router.name},
        "routeStrategy": router.route_strategy,
        "defaultRoute": router.default_route,
        "responseHeaderTimeoutSeconds": _seconds(router.proxy.response_header_timeout_seconds),
        "maxHeldRequests": router.proxy.max_held_requests,
        "maxBodyBytes": MAX_BODY_BYTES,
        "backends": backends,
        "pools": [
            {
                "name": pool.name,
                "members": list(pool.member_names),
                "default": pool.default,
                "swapPolicy": pool.swap_policy,
                "swapBudgetSeconds": _seconds(pool.swap_budget_seconds),
                "maxWaitSeconds": _seconds(pool.max_wait_seconds),
                "minResidencySeconds": _seconds(pool.min_residency_seconds),
            }
            for pool in fronted_pools(router, pools)
        ],
    }


def config_json(config: Mapping[str, Any]) -> str:
    """The config as stored in the ConfigMap: stable key order, one trailing newline."""
    return json.dumps(config, indent=2) + "\n"


def config_hash(text: str) -> str:
    """sha256 of the stored config text; the router's pod template carries it."""
    return hashlib.sha256(text.encode()).hexdigest()
