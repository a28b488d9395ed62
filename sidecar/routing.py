"""Which backend serves a request: pure lookup from the `model` field.

`BackendNameMatch` picks the backend whose name or alias equals the model, else the
default route; `Static` always sends to the default route. The table is built once per
config so that a request costs one dict lookup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.config import BackendConfig, RouterConfig

BACKEND_NAME_MATCH = "BackendNameMatch"
STATIC = "Static"


@dataclass(frozen=True)
class Routes:
    by_name: Mapping[str, BackendConfig]
    default: BackendConfig | None
    static: bool

    def resolve(self, model: str) -> BackendConfig | None:
        if self.static:
            return self.default
        return self.by_name.get(model, self.default)

    def names(self) -> list[tuple[str, BackendConfig]]:
        """Every model id a client may ask for (names, then aliases), with its backend."""
        return list(self.by_name.items())


def build_routes(config: RouterConfig) -> Routes:
    by_name: dict[str, BackendConfig] = {}
    for backend in config.backends:
        by_name.setdefault(backend.name, backend)
    for backend in config.backends:
        for alias in backend.aliases:
            by_name.setdefault(alias, backend)
    default = None if config.default_route is None else by_name.get(config.default_route)
    return Routes(by_name=by_name, default=default, static=config.route_strategy == STATIC)
