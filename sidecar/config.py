"""The router's settings, loaded from the config the reconciler renders.

The JSON shape is the contract in docs/contracts.md section 1; this module turns it into
frozen dataclasses once, at load, and names any missing or mistyped key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The router config is invalid; the message names the key."""


@dataclass(frozen=True)
class BackendConfig:
    name: str
    aliases: tuple[str, ...]
    model_server: str | None
    service: str | None
    port: int | None
    pool: str | None
    url: str | None
    # The member's readiness probe path (None: probed by TCP, or not a ModelServer). The
    # activator probes a swap's target there before its endpoint turns ready.
    readiness_path: str | None = None
    # Wait (hold for a swap), IfIdle (hold only if the swap can start at once, else the
    # fallback), Never (never swap: the fallback while not resident). sidecar.fallback.
    activation: str = "Wait"
    fallback: Fallback | None = None


@dataclass(frozen=True)
class Fallback:
    """The backend that answers instead, and the `model` it is sent (None: the client's)."""

    backend: str
    model: str | None = None


@dataclass(frozen=True)
class PoolConfig:
    name: str
    members: tuple[str, ...]
    default: str | None
    swap_policy: str
    swap_budget_seconds: float
    max_wait_seconds: float | None
    min_residency_seconds: float


@dataclass(frozen=True)
class RouterConfig:
    namespace: str
    name: str
    route_strategy: str
    default_route: str | None
    response_header_timeout_seconds: float
    max_held_requests: int
    max_body_bytes: int
    backends: tuple[BackendConfig, ...]
    pools: tuple[PoolConfig, ...]
    # A held `stream: true` request gets an SSE comment this often (sidecar.held_stream),
    # or with "content" a visible delta saying the same.
    held_stream_keepalive_seconds: float = 5.0
    held_stream_progress: str = "comment"

    def backend(self, name: str) -> BackendConfig | None:
        return next((b for b in self.backends if b.name == name), None)

    def pool(self, name: str) -> PoolConfig | None:
        return next((p for p in self.pools if p.name == name), None)

    def backend_for_member(self, member: str) -> BackendConfig | None:
        return next((b for b in self.backends if b.model_server == member), None)


def _get(obj: Mapping[str, Any], key: str, where: str, typ: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise ConfigError(f"{where}.{key} is required")
    value = obj[key]
    if not isinstance(value, typ) or (isinstance(value, bool) and bool not in _as_tuple(typ)):
        raise ConfigError(f"{where}.{key} has the wrong type: {type(value).__name__}")
    return value


def _as_tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def _opt(obj: Mapping[str, Any], key: str, where: str, typ: type | tuple[type, ...]) -> Any:
    if obj.get(key) is None:
        return None
    return _get(obj, key, where, typ)


_NUM = (int, float)


def parse_config(raw: Mapping[str, Any]) -> RouterConfig:
    router = _get(raw, "router", "config", dict)
    backends = []
    for i, b in enumerate(_get(raw, "backends", "config", list)):
        where = f"backends[{i}]"
        if not isinstance(b, dict):
            raise ConfigError(f"{where} must be an object")
        backends.append(
            BackendConfig(
                name=_get(b, "name", where, str),
                aliases=tuple(b.get("aliases") or ()),
                model_server=_opt(b, "modelServer", where, str),
                service=_opt(b, "service", where, str),
                port=_opt(b, "port", where, int),
                pool=_opt(b, "pool", where, str),
                url=_opt(b, "url", where, str),
                readiness_path=_opt(b, "readinessPath", where, str),
                activation=_choice(b, "activation", ACTIVATIONS, where),
                fallback=_fallback(b, where),
            )
        )
        if (backends[-1].url is None) == (backends[-1].service is None):
            raise ConfigError(f"{where} needs exactly one of url and service")
    pools = []
    for i, p in enumerate(raw.get("pools") or ()):
        where = f"pools[{i}]"
        if not isinstance(p, dict):
            raise ConfigError(f"{where} must be an object")
        max_wait = _opt(p, "maxWaitSeconds", where, _NUM)
        pools.append(
            PoolConfig(
                name=_get(p, "name", where, str),
                members=tuple(_get(p, "members", where, list)),
                default=_opt(p, "default", where, str),
                swap_policy=str(p.get("swapPolicy") or "sticky"),
                swap_budget_seconds=float(_get(p, "swapBudgetSeconds", where, _NUM)),
                max_wait_seconds=None if max_wait is None else float(max_wait),
                min_residency_seconds=float(_opt(p, "minResidencySeconds", where, _NUM) or 0),
            )
        )
    for b in backends:
        if b.fallback is not None and b.fallback.backend not in {o.name for o in backends}:
            raise ConfigError(f"backend {b.name}: fallback {b.fallback.backend!r} is no backend")
    loop = fallback_loop(tuple(backends))
    if loop is not None:
        raise ConfigError(f"backends fall back in a loop: {' -> '.join(loop)}")
    return RouterConfig(
        namespace=_get(router, "namespace", "router", str),
        name=_get(router, "name", "router", str),
        route_strategy=str(raw.get("routeStrategy") or "BackendNameMatch"),
        default_route=_opt(raw, "defaultRoute", "config", str),
        response_header_timeout_seconds=float(
            _get(raw, "responseHeaderTimeoutSeconds", "config", _NUM)
        ),
        max_held_requests=int(_get(raw, "maxHeldRequests", "config", int)),
        max_body_bytes=int(raw.get("maxBodyBytes") or 32 * 1024 * 1024),
        backends=tuple(backends),
        pools=tuple(pools),
        held_stream_keepalive_seconds=_positive(
            _opt(raw, "heldStreamKeepaliveSeconds", "config", _NUM), 5.0,
            "config.heldStreamKeepaliveSeconds"),
        held_stream_progress=_choice(raw, "heldStreamProgress", ("comment", "content")),
    )


ACTIVATIONS = ("Wait", "IfIdle", "Never")


def _choice(raw: Mapping[str, Any], key: str, allowed: tuple[str, ...],
            where: str = "config") -> str:
    value = _opt(raw, key, where, str) or allowed[0]
    if value not in allowed:
        raise ConfigError(f"{where}.{key} must be one of {', '.join(allowed)}, not {value!r}")
    return str(value)


def _fallback(backend: Mapping[str, Any], where: str) -> Fallback | None:
    raw = backend.get("fallback")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.fallback must be an object")
    return Fallback(backend=_get(raw, "backend", f"{where}.fallback", str),
                    model=_opt(raw, "model", f"{where}.fallback", str))


def fallback_loop(backends: tuple[BackendConfig, ...]) -> list[str] | None:
    """The first chain of fallbacks that comes back to where it started, if any."""
    by_name = {b.name: b for b in backends}
    for start in backends:
        chain, current = [start.name], start
        while current.fallback is not None and current.fallback.backend in by_name:
            current = by_name[current.fallback.backend]
            chain.append(current.name)
            if current.name in chain[:-1]:
                return chain
    return None


def _positive(value: float | None, default: float, where: str) -> float:
    if value is None:
        return default
    if value <= 0:
        raise ConfigError(f"{where} must be positive, not {value}")
    return float(value)


def load_config(path: Path) -> RouterConfig:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read router config {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"router config {path} must hold a JSON object")
    return parse_config(raw)
