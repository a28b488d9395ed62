"""The reconciler's background tasks (reconciler/context.py): at a stop every one is
cancelled and waited for, so none still holds a connection when the clients close."""

from __future__ import annotations

import asyncio

import pytest

from reconciler.context import Background

pytestmark = pytest.mark.unit


async def test_a_stop_waits_until_every_cancelled_task_has_ended() -> None:
    background = Background()
    ended: list[str] = []

    async def holds_a_connection() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # its connection closes on the way out
            ended.append("closed")

    background.run(holds_a_connection, "event")
    await asyncio.sleep(0)
    await background.stop()
    assert ended == ["closed"] and not background.tasks


async def test_a_task_that_will_not_end_holds_a_stop_no_longer_than_its_bound() -> None:
    background = Background()
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    background.start(stubborn(), "stubborn")
    await asyncio.sleep(0)
    await asyncio.wait_for(background.stop(within=0.05), 5)
    release.set()
    await asyncio.sleep(0)
