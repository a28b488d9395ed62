"""Fall through instead of waiting: which backend answers a request, given each backend's
activation mode and fallback (the ModelRouter's `spec.backends[].activation` and
`.fallback`). Pure: the activator is asked through two callables.

- `Wait` (the default): the request is held for a swap, as always.
- `IfIdle`: held only if the swap can start at once (no swap runs, and the resident member
  has nothing in flight through this router); otherwise the fallback answers.
- `Never`: never a swap; while the member is not resident the fallback answers.

The fallback may have a mode and fallback of its own; the chain is loop-free (admission,
the reconciler and the router's config parser all refuse a loop, and this stops at a
backend it has seen). The client's `model` is sent on unchanged unless the fallback names
the `model` to send it. The response says which backend answered (`X-Modelpool-Backend`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sidecar.config import BackendConfig, RouterConfig

ANSWERED_BY = "X-Modelpool-Backend"


def choose(
    backend: BackendConfig,
    config: RouterConfig,
    serves_now: Callable[[BackendConfig], bool],
    swap_can_start: Callable[[BackendConfig], bool],
) -> tuple[BackendConfig, str | None]:
    """The backend that answers, and the `model` to send it (None: the client's own)."""
    model: str | None = None
    seen: set[str] = set()
    while backend.fallback is not None and backend.activation != "Wait":
        seen.add(backend.name)
        if serves_now(backend):
            break
        if backend.activation == "IfIdle" and swap_can_start(backend):
            break
        nxt = config.backend(backend.fallback.backend)
        if nxt is None or nxt.name in seen:
            break
        model = backend.fallback.model
        backend = nxt
    return backend, model


def with_model(body: bytes, model: str) -> bytes:
    """The request body with its `model` replaced (the body is known to be a JSON object)."""
    payload = json.loads(body)
    payload["model"] = model
    return json.dumps(payload).encode()
