"""The router's Events through the activation shell (sidecar.activation), in memory.

The API server is the functional tests' `FakeCluster` (our own KubePort) with an Event
recorder added, so `Activation` finds it an `EventPort` as it finds `sidecar.kube`'s
client; `EventReporter` is also driven alone against ports that fail or hang, to show
that posting an Event never holds up or fails a request. The real API server (RBAC, the
router's own token) is exercised in e2e/tests/test_router_events.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from sidecar.activator import LastSwap, PoolRequest
from sidecar.event_reporter import EventPort, EventReporter
from sidecar.events import (
    HELD_REQUESTS_FAILED,
    HELD_REQUESTS_REJECTED,
    NORMAL,
    SWAP_REQUESTED,
    WARNING,
    Note,
    Post,
)
from sidecar.kube import KubeClient
from sidecar.target import ActivationError
from tests.functional.test_activation import NS, Router, router_config, running
from tests.kube_fake import FakeCluster

pytestmark = pytest.mark.unit


class Recorder:
    """An EventPort that records what it was asked to post, after `delay` seconds."""

    def __init__(self, delay: float = 0.0, fail: Exception | None = None) -> None:
        self.posts: list[tuple[Post, str]] = []
        self.calls = 0
        self.delay = delay
        self.fail = fail

    async def post_event(self, post: Post, instance: str) -> None:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        self.posts.append((post, instance))


class EventfulCluster(FakeCluster, Recorder):
    def __init__(self) -> None:
        FakeCluster.__init__(self)
        Recorder.__init__(self)


@pytest.fixture
def fake() -> EventfulCluster:
    c = EventfulCluster()
    c.set_pool("heavy", resident_member="coder", request=PoolRequest("coder", 3, "reconciler"))
    c.set_endpoints("coder", "127.0.1.3")
    return c


async def eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def reasons(port: Recorder) -> list[str]:
    return [p.reason for p, _ in port.posts]


def test_the_kube_client_is_an_event_port_and_the_plain_fake_is_not() -> None:
    assert isinstance(KubeClient(object()), EventPort)
    assert not isinstance(FakeCluster(), EventPort)


async def test_writing_a_swap_request_posts_swap_requested(fake: EventfulCluster) -> None:
    router = Router(fake, router_config(), name="chat-7d9c")

    async def body() -> None:
        held = [asyncio.create_task(router.call("gemma")) for _ in range(3)]
        await eventually(lambda: len(fake.writes) == 1 and len(fake.posts) == 1)
        post, instance = fake.posts[0]
        assert instance == "chat-7d9c"
        assert (post.namespace, post.pool, post.type, post.reason) == (
            NS,
            "heavy",
            NORMAL,
            SWAP_REQUESTED,
        )
        assert post.message.startswith("router chat asked for gemma (resident coder, ")
        for t in held:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        # The withdrawal that follows is no Event.
        await eventually(lambda: len(fake.requests_for(None)) == 1)
        assert reasons(fake) == [SWAP_REQUESTED]

    await running([router], body)


async def test_an_abandoned_swap_posts_held_requests_failed(fake: EventfulCluster) -> None:
    router = Router(fake, router_config(budget=30))

    async def body() -> None:
        waiters = [asyncio.create_task(router.call("gemma")) for _ in range(2)]
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 2
        )
        generation = fake.pools["heavy"].request
        assert generation is not None
        fake.set_pool(
            "heavy",
            request=PoolRequest(None, generation.generation + 1, "reconciler"),
            last_swap=LastSwap("coder", "gemma", generation.generation, "Abandoned", 30.0),
        )
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, ActivationError) for r in results)
        await eventually(lambda: HELD_REQUESTS_FAILED in reasons(fake))
        (failed,) = [p for p, _ in fake.posts if p.reason == HELD_REQUESTS_FAILED]
        assert failed.type == WARNING
        assert failed.message == (
            "router chat failed 2 requests held for gemma: the reconciler abandoned the swap"
        )

    await running([router], body)


async def test_a_flood_of_rejections_posts_one_event(fake: EventfulCluster) -> None:
    router = Router(fake, router_config(max_held=1))

    async def body() -> None:
        held = asyncio.create_task(router.call("gemma"))
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 1
        )
        sent = set()
        for _ in range(50):
            with pytest.raises(ActivationError) as caught:
                await router.call("gemma")
            sent.add(caught.value.status)
        assert sent == {503}
        await eventually(lambda: HELD_REQUESTS_REJECTED in reasons(fake))
        rejected = [p for p, _ in fake.posts if p.reason == HELD_REQUESTS_REJECTED]
        # the Event says what the clients were answered
        assert [p.message for p in rejected] == [
            "router chat answered 1 request for gemma with 503: maxHeldRequests 1 reached"
        ]
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)

    await running([router], body)


# --- the reporter alone -----------------------------------------------------------------


def rejected(n: int = 1) -> Note:
    return Note(NS, "heavy", WARNING, HELD_REQUESTS_REJECTED, f"{n} rejected", n)


async def reporting(reporter: EventReporter) -> asyncio.Task[None]:
    task = asyncio.create_task(reporter.run())
    await asyncio.sleep(0)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), "the reporter ended on its own"


async def test_folded_notes_come_out_as_one_summary_when_the_window_closes() -> None:
    port = Recorder()
    reporter = EventReporter(port, "pod-a", window=0.3)
    task = await reporting(reporter)
    try:
        started = time.monotonic()
        for n in range(1, 6):
            reporter.note(rejected(n))
        await eventually(lambda: len(port.posts) == 1)
        await eventually(lambda: len(port.posts) == 2)
        assert time.monotonic() - started >= 0.3
        summary, instance = port.posts[1]
        assert instance == "pod-a"
        assert summary.count == 4
        assert summary.message.startswith("5 rejected (the latest of 4 in the last ")
        assert summary.message.endswith("; 14 requests in all)")
    finally:
        await stop(task)


async def test_a_failing_port_never_reaches_the_caller_and_is_logged_once_per_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = Recorder(fail=OSError("connection refused"))
    reporter = EventReporter(port, "pod-a", window=0.0)
    task = await reporting(reporter)
    caplog.set_level(logging.DEBUG, logger="sidecar.event_reporter")
    try:
        for n in range(3):
            reporter.note(rejected(n))  # returns at once, raises nothing
            reporter.note(Note(NS, "heavy", NORMAL, SWAP_REQUESTED, "asked"))

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "could not post Event" in r.getMessage()]

        await eventually(lambda: len(failures()) == 6)
        warned = [r.getMessage() for r in failures() if r.levelno == logging.WARNING]
        assert warned == [
            "pool demo/heavy: could not post Event HeldRequestsRejected: connection refused",
            "pool demo/heavy: could not post Event SwapRequested: connection refused",
        ]
        # Once a post of that reason succeeds, its next failure is news again.
        port.fail = None
        reporter.note(rejected())
        await eventually(lambda: len(port.posts) == 1)
        port.fail = OSError("gone again")
        reporter.note(rejected())
        await eventually(lambda: len(failures()) == 7)
        assert failures()[-1].levelno == logging.WARNING
    finally:
        await stop(task)


async def test_a_hung_post_is_given_up_and_the_next_one_goes() -> None:
    port = Recorder(delay=3600.0)
    reporter = EventReporter(port, "pod-a", timeout=0.1)
    task = await reporting(reporter)
    try:
        started = time.monotonic()
        reporter.note(rejected())
        assert time.monotonic() - started < 0.05  # noting never waits for the post
        await eventually(lambda: port.calls == 1)  # the reporter hangs on the post
        port.delay = 0.0
        reporter.note(Note(NS, "heavy", NORMAL, SWAP_REQUESTED, "asked"))
        await eventually(lambda: reasons(port) == [SWAP_REQUESTED], within=2.0)
    finally:
        await stop(task)
