"""Whether a failed call to a member means its endpoint is dead.

A request that never reached a live server (the endpoint refused the connection, or the
server died with the connection half-open) is no reason to answer 502: the activation
marks the address bad and re-verifies the member's residency, and the proxy dispatches
the request once more through it, held until the member is ready again. Any other
failure is the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sidecar import errors
from sidecar.errors import ProxyError
from sidecar.http.probes import reachable

Reachable = Callable[[str, float], Awaitable[bool]]


async def is_dead(
    err: ProxyError, base_url: str, connect_timeout: float, *, probe: Reachable = reachable
) -> bool:
    """Whether the endpoint at `base_url`, whose call failed with `err`, is dead: no
    connection could be made, or the connection broke and a fresh one is refused. (A
    pooled connection that the server closed breaks the same way as a server that died,
    but only the dead one refuses a new connection.)"""
    if errors.is_connect_failure(err):
        return True
    return err.kind == "disconnect" and not await probe(base_url, connect_timeout)
