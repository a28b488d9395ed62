"""The keyed work queue: dedupe, one worker per key, delays, backoff with jitter."""

from __future__ import annotations

import asyncio

import pytest

from reconciler.workqueue import Backoff, QueueShutDown, WorkQueue

pytestmark = pytest.mark.unit


async def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ["a", "b", "a", "a", "b"]:
        q.add(key)
    assert len(q) == 2
    assert [await q.get(), await q.get()] == ["a", "b"]


async def test_a_key_added_while_processed_comes_back_only_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")
    q.add("a")
    assert len(q) == 0  # not handed to a second worker
    q.done(key)
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    assert len(q) == 0


async def test_get_waits_for_a_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    waiter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    q.add("x")
    assert await asyncio.wait_for(waiter, 1) == "x"


async def test_add_after_keeps_the_earliest_deadline() -> None:
    q: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    start = loop.time()
    q.add_after("a", 30)
    q.add_after("a", 0.05)
    q.add_after("a", 10)
    assert await asyncio.wait_for(q.get(), 5) == "a"
    assert loop.time() - start < 5
    q.done("a")
    q.shutdown()


async def test_retry_backs_off_exponentially_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(Backoff(base=1, maximum=5, jitter=0.5), rand=lambda: 0.5)
    assert [q.retry("a") for _ in range(5)] == [1.25, 2.5, 5.0, 6.25, 6.25]
    assert q.failures("a") == 5
    q.forget("a")
    assert q.retry("a") == 1.25
    q.shutdown()


@pytest.mark.parametrize(
    ("failures", "rand", "expected"),
    [(1, 0.0, 0.1), (2, 0.0, 0.2), (4, 0.999, 0.8 * 1.1998), (40, 0.0, 60.0)],
)
def test_backoff_delay(failures: int, rand: float, expected: float) -> None:
    assert Backoff().delay(failures, rand) == pytest.approx(expected)


async def test_shutdown_releases_waiting_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    waiter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.shutdown()
    with pytest.raises(QueueShutDown):
        await asyncio.wait_for(waiter, 1)
    q.add("a")
    assert len(q) == 0


async def test_urgent_keys_are_served_first_each_kind_in_arrival_order() -> None:
    q: WorkQueue[str] = WorkQueue(urgent=lambda key: key.startswith("pool"))
    for key in ["server-1", "pool-1", "server-2", "pool-2", "router-1"]:
        q.add(key)
    first = await q.get()
    q.add("pool-3")  # comes after the urgent keys already waiting, before the others
    q.done(first)
    q.add(first)  # an urgent key processed again goes with the urgent ones
    served = [first] + [await q.get() for _ in range(len(q))]
    assert served == ["pool-1", "pool-2", "pool-3", "pool-1", "server-1", "server-2",
                      "router-1"]


async def test_a_restart_backlog_holds_no_pool_behind_the_servers() -> None:
    q: WorkQueue[str] = WorkQueue(urgent=lambda key: key.startswith("pool"))
    for n in range(500):
        q.add(f"server-{n}")
    q.add("pool-waiting")
    assert await q.get() == "pool-waiting"


async def test_a_key_that_comes_straight_back_never_holds_the_event_loop() -> None:
    """A worker whose reconcile awaits nothing that suspends, and whose key is queued again
    at once (a wake already due), still lets the rest of the loop run: the idle probe it
    waits for, the watches, the health server."""
    q: WorkQueue[str] = WorkQueue()
    answered = asyncio.Event()

    async def probe() -> None:
        answered.set()

    asyncio.get_running_loop().create_task(probe())
    q.add("pool")
    turns = 0
    while not answered.is_set() and turns < 10_000:
        key = await q.get()
        q.add(key)  # requeued at once, as add_after(key, 0) does
        q.done(key)
        turns += 1
    assert answered.is_set() and turns <= 2, turns
