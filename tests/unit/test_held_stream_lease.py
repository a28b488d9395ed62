"""`HeldStream.hold` enters the activator's lease for a streamed request. If the client
goes in the very turn of the loop in which the lease was entered, the caller never sees
the target, so `hold` itself leaves the lease: otherwise the backend would count a
request in flight for ever (and an `IfIdle` backend would never swap again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sidecar.held_stream import HeldStream


class Lease:
    """Entered at once; cancels `victim` as it is entered, as a client leaving then does."""

    def __init__(self) -> None:
        self.entered = 0
        self.left = 0
        self.victim: asyncio.Future[Any] | None = None

    async def __aenter__(self) -> str:
        self.entered += 1
        assert self.victim is not None
        self.victim.cancel()
        return "target"

    async def __aexit__(self, *exc: object) -> None:
        self.left += 1


def held() -> HeldStream:
    # The reply is only written to once the hold lasts HOLD_NOTICE_AFTER, which it never
    # does here.
    return HeldStream(None, None, "coder", 1.0, lambda: "loading")  # type: ignore[arg-type]


async def test_a_lease_entered_as_the_client_leaves_is_left_again() -> None:
    lease = Lease()
    holding = asyncio.ensure_future(held().hold(lease))
    lease.victim = holding
    with pytest.raises(asyncio.CancelledError):
        await holding
    assert lease.entered == 1
    assert lease.left == 1


async def test_a_lease_entered_in_time_is_the_callers_to_leave() -> None:
    lease = Lease()
    lease.victim = asyncio.ensure_future(asyncio.sleep(3600))  # someone else's task
    assert await held().hold(lease) == "target"
    assert (lease.entered, lease.left) == (1, 0)
    assert lease.victim.cancelled() or lease.victim.cancelling()
