"""A TLS handshake cut short by a cancellation closes its socket.

httpcore (under httpx, under kr8s) connects in two steps: a TCP connection, then the TLS
handshake on it. A handshake that fails closes the connection; one that is cancelled (the
task of a request stopped in flight, as every request of a program that stops is) leaves
the socket open with no one to close it: httpcore's anyio backend closes only on an
`Exception`, and `CancelledError` is not one. `install` wraps that step so it closes the
socket on any way out, once per process.
"""

from __future__ import annotations

import functools
from typing import Any

import anyio
from httpcore._backends.anyio import AnyIOStream

_MARK = "_modelpool_closes_on_cancel"


def install() -> None:
    """Make a cancelled handshake close its socket (idempotent)."""
    start_tls = AnyIOStream.start_tls
    if getattr(start_tls, _MARK, False):
        return

    @functools.wraps(start_tls)
    async def closing_start_tls(self: AnyIOStream, *args: Any, **kwargs: Any) -> Any:
        try:
            return await start_tls(self, *args, **kwargs)
        except BaseException:
            # Closes at once, before any wait: a cancelled task may not wait again.
            await anyio.aclose_forcefully(self._stream)
            raise

    setattr(closing_start_tls, _MARK, True)
    AnyIOStream.start_tls = closing_start_tls  # type: ignore[method-assign]
