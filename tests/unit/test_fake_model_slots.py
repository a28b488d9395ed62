"""The fake model server's slots hand a freed slot to the request waiting for one in the
same step, as llama.cpp does: the idle probe's reading of `/slots` (and so the drain's
safety) depends on no idle reading while a request still waits."""

from __future__ import annotations

import asyncio

import pytest

from e2e.fake_model.app import SlotTable

pytestmark = pytest.mark.unit


async def _steps_until(condition: object) -> None:
    """Lets the loop run until `condition()` holds (a bounded number of steps)."""
    assert callable(condition)
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def _one_holding_one_waiting(
    table: SlotTable, release_first: asyncio.Event
) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
    """A generation holding the table's one slot until `release_first`, and one waiting."""

    async def generate(until: asyncio.Event) -> None:
        async with table.hold():
            await until.wait()

    first = asyncio.create_task(generate(release_first))
    await _steps_until(lambda: table.busy)
    queued = asyncio.create_task(generate(asyncio.Event()))
    await _steps_until(lambda: table.waiting == 1)
    return first, queued


async def test_a_freed_slot_passes_to_a_waiting_request_without_an_idle_moment() -> None:
    table = SlotTable(1)
    done_a = asyncio.Event()
    first, queued = await _one_holding_one_waiting(table, done_a)
    task_before = table.task_of[0]
    done_a.set()
    readings = []
    while not first.done():
        readings.append(bool(table.busy))
        await asyncio.sleep(0)
    readings.append(bool(table.busy))
    assert all(readings), readings
    assert table.task_of[0] == task_before + 1 and table.waiting == 0 and table.served == 1
    queued.cancel()  # handed the slot, cancelled before or after it ran: the slot is freed
    await asyncio.gather(queued, return_exceptions=True)
    assert table.busy == set()


async def test_a_cancelled_waiter_is_skipped_and_the_slot_freed() -> None:
    table = SlotTable(1)
    release = asyncio.Event()
    first, gone = await _one_holding_one_waiting(table, release)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert table.waiting == 0
    release.set()
    await first
    assert table.busy == set() and table.served == 1
    async with table.hold() as slot:
        assert slot == 0 and table.busy == {0}
