"""`sidecar.http.client.ReadDeadlines`: one timer keeps every read timeout of a client. A read
that waits too long fails with ReadTimedOut, never before its timeout; one that got its
answer is left alone; a shorter timeout is kept even while a long one set the pace; and
the timer is only set while something waits."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.http import client as upstream


async def test_a_read_that_waits_too_long_fails_after_its_timeout_and_not_before() -> None:
    loop = asyncio.get_running_loop()
    deadlines = upstream.ReadDeadlines(loop)
    waiter: asyncio.Future[None] = loop.create_future()
    began = loop.time()
    deadlines.watch(waiter, 0.2)
    with pytest.raises(upstream.ReadTimedOut, match=r"no answer within 0\.2 s"):
        async with asyncio.timeout(5):
            await waiter
    assert loop.time() - began >= 0.2
    deadlines.forget(waiter)  # as `_wait` does once its waiter is done, expired or not
    assert not deadlines.armed


async def test_an_answered_read_is_left_alone_and_the_timer_stops_when_none_waits() -> None:
    loop = asyncio.get_running_loop()
    deadlines = upstream.ReadDeadlines(loop)
    answered: asyncio.Future[None] = loop.create_future()
    late: asyncio.Future[None] = loop.create_future()
    deadlines.watch(answered, 0.05)
    deadlines.watch(late, 0.1)
    answered.set_result(None)
    deadlines.forget(answered)
    with pytest.raises(upstream.ReadTimedOut):
        async with asyncio.timeout(5):
            await late
    assert answered.result() is None
    deadlines.forget(late)
    assert not deadlines.armed


async def test_a_short_timeout_is_kept_while_a_long_one_set_the_pace() -> None:
    loop = asyncio.get_running_loop()
    deadlines = upstream.ReadDeadlines(loop)
    patient: asyncio.Future[None] = loop.create_future()
    hasty: asyncio.Future[None] = loop.create_future()
    deadlines.watch(patient, 600.0)  # checked every 150 s on its own
    deadlines.watch(hasty, 0.05)
    with pytest.raises(upstream.ReadTimedOut):
        async with asyncio.timeout(5):  # not 150 s
            await hasty
    assert not patient.done()
    assert deadlines.armed  # for the patient one
    deadlines.forget(patient)
    deadlines.forget(hasty)
