"""The activation shell (sidecar.activation) driven through its public interface.

The API server is replaced by `FakeCluster` (`tests.kube_fake`), an in-memory
implementation of our own `KubePort` with the contract's compare-and-swap semantics
(docs/contracts.md section 2), shared by several `Activation`s to stand for several
router replicas. The tests play the reconciler by editing the fake's pool status and
EndpointSlices. The real API server is exercised in tests/integration/test_router_kube.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.activation import Activation
from sidecar.activator import LastSwap, PoolRequest, PoolStatus, SwapProgress, WriteRequest
from sidecar.config import RouterConfig, parse_config
from sidecar.metrics import RouterMetrics
from sidecar.target import ActivationError, Target
from tests.kube_fake import FakeCluster

pytestmark = pytest.mark.functional

NS = "demo"


def router_config(
    *, budget: float = 5.0, max_held: int = 100, policy: str = "sticky"
) -> RouterConfig:
    def member(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "aliases": [],
            "modelServer": name,
            "service": name,
            "port": 8080,
            "pool": "heavy",
            "url": None,
        }

    return parse_config(
        {
            "version": 1,
            "router": {"namespace": NS, "name": "chat"},
            "responseHeaderTimeoutSeconds": 1,
            "maxHeldRequests": max_held,
            "backends": [
                member("coder"),
                member("gemma"),
                {
                    "name": "external",
                    "aliases": [],
                    "modelServer": None,
                    "service": None,
                    "port": None,
                    "pool": None,
                    "url": "http://127.0.0.9:8000/",
                },
            ],
            "pools": [
                {
                    "name": "heavy",
                    "members": ["coder", "gemma"],
                    "default": "coder",
                    "swapPolicy": policy,
                    "swapBudgetSeconds": budget,
                    "maxWaitSeconds": 0.2,
                    "minResidencySeconds": 0,
                },
            ],
        }
    )


class Router:
    """One router replica: an Activation running against the shared fake pools."""

    def __init__(self, pools: FakeCluster, config: RouterConfig, name: str = "chat-a",
                 clock: Callable[[], float] = time.monotonic):
        self.registry = CollectorRegistry()
        self.activation = Activation(
            config, pools, RouterMetrics(self.registry, "chat"), identity=f"{NS}/chat/{name}",
            clock=clock,
        )
        self.config = config

    def backend(self, name: str) -> Any:
        b = self.config.backend(name)
        assert b is not None
        return b

    async def call(self, backend: str) -> Target:
        async with self.activation.acquire(self.backend(backend)) as target:
            return target

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, {"router": "chat", **labels})
        return 0.0 if value is None else value


class ManualClock:
    """The activation's clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def stays(check: Callable[[], bool], window: float = 0.05) -> None:
    """`check` holds throughout `window` seconds: for what must not happen, once the
    events it would follow have been handled (there is no later event to wait for)."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        assert check(), "condition stopped holding"
        await asyncio.sleep(0.005)
    assert check(), "condition stopped holding"


@pytest.fixture
def pools() -> FakeCluster:
    c = FakeCluster()
    c.set_pool("heavy", resident_member="coder", request=PoolRequest("coder", 3, "reconciler"))
    c.set_endpoints("coder", "127.0.1.3")
    return c


async def running(routers: list[Router], body: Callable[[], Awaitable[None]]) -> None:
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(r.activation.run()) for r in routers]
        try:
            await eventually(lambda: all(r.activation.ready() for r in routers))
            await body()
        finally:
            for t in tasks:
                t.cancel()


async def test_url_backend_is_served_at_once(pools: FakeCluster) -> None:
    router = Router(pools, router_config())
    assert router.activation.ready() is False  # no lists yet

    async def body() -> None:
        target = await router.call("external")
        assert target == Target("http://127.0.0.9:8000", "external", None)

    await running([router], body)


async def test_same_model_requests_coalesce_onto_the_resident(pools: FakeCluster) -> None:
    router = Router(pools, router_config())

    async def body() -> None:
        targets = await asyncio.gather(*(router.call("coder") for _ in range(5)))
        assert {t.base_url for t in targets} == {"http://127.0.1.3:8080"}
        assert pools.writes == []
        assert router.sample("modelpool_coalesced_total", pool="heavy", member="coder") == 5
        assert router.activation.model_states() == {
            "coder": "resident",
            "gemma": "stopped",
            "external": "ready",
        }

    await running([router], body)


async def test_cross_model_requests_are_held_and_the_swap_requested_once(
    pools: FakeCluster,
) -> None:
    router = Router(pools, router_config())

    async def body() -> None:
        held = [asyncio.create_task(router.call("gemma")) for _ in range(5)]
        await eventually(lambda: len(pools.writes) == 1)
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 5
        )
        assert pools.writes[0].request == PoolRequest("gemma", 4, f"{NS}/chat/chat-a")
        assert router.activation.model_states()["gemma"] == "loading"
        # The resident keeps serving its own model meanwhile.
        assert (await router.call("coder")).base_url == "http://127.0.1.3:8080"
        # The reconciler swaps: resident changes, then the endpoint turns ready.
        pools.set_pool("heavy", swap=SwapProgress("coder", "gemma", 4, "Loading"))
        pools.set_pool("heavy", resident_member="gemma", swap=None)
        await eventually(pools.delivered)
        # Resident without a ready endpoint: still held.
        await stays(lambda: not any(t.done() for t in held))
        pools.set_endpoints("gemma", "127.0.1.4")
        targets = await asyncio.gather(*held)
        assert {t.base_url for t in targets} == {"http://127.0.1.4:8080"}
        assert {t.pool for t in targets} == {"heavy"}
        assert len(pools.writes) == 1
        assert router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 0
        assert (
            router.sample("modelpool_hold_duration_seconds_count", pool="heavy", member="gemma")
            == 5
        )

    await running([router], body)


async def test_past_the_swap_budget_held_requests_get_503_and_the_request_is_withdrawn(
    pools: FakeCluster,
) -> None:
    router = Router(pools, router_config(budget=0.3))

    async def body() -> None:
        started = time.monotonic()
        with pytest.raises(ActivationError) as caught:
            await router.call("gemma")
        waited = time.monotonic() - started
        assert 0.3 <= waited < 2.0
        assert caught.value.code == "swap_budget_exceeded"
        assert caught.value.status == 503
        assert caught.value.retry_after is not None and caught.value.retry_after >= 1
        await eventually(lambda: len(pools.requests_for(None)) == 1)
        assert pools.pools["heavy"].request == PoolRequest(None, 5, f"{NS}/chat/chat-a")

    await running([router], body)


async def test_over_max_held_requests_a_request_fails_at_once(pools: FakeCluster) -> None:
    router = Router(pools, router_config(max_held=2))

    async def body() -> None:
        held = [asyncio.create_task(router.call("gemma")) for _ in range(2)]
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 2
        )
        with pytest.raises(ActivationError) as caught:
            await router.call("gemma")
        assert caught.value.code == "too_many_held_requests"
        assert caught.value.retry_after is not None
        for t in held:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)

    await running([router], body)


async def test_a_client_leaving_mid_load_does_not_abort_it(pools: FakeCluster) -> None:
    router = Router(pools, router_config())

    async def body() -> None:
        waiter = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: len(pools.writes) == 1)
        pools.set_pool("heavy", swap=SwapProgress("coder", "gemma", 4, "Unloading"))
        await eventually(pools.delivered)  # the router has seen the unload begin
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 0
        )
        await stays(lambda: pools.requests_for(None) == [])  # no withdrawal once unloading
        assert pools.pools["heavy"].request is not None
        assert pools.pools["heavy"].request.member == "gemma"

    await running([router], body)


async def test_all_waiters_leaving_before_the_unload_withdraws(pools: FakeCluster) -> None:
    router = Router(pools, router_config())

    async def body() -> None:
        waiters = [asyncio.create_task(router.call("gemma")) for _ in range(3)]
        await eventually(lambda: len(pools.writes) == 1)
        pools.set_pool("heavy", swap=SwapProgress("coder", "gemma", 4, "Draining"))
        await eventually(pools.delivered)
        for w in waiters[:2]:
            w.cancel()
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 1
        )
        await stays(lambda: pools.requests_for(None) == [])  # one waiter is still there
        waiters[2].cancel()
        await eventually(lambda: len(pools.requests_for(None)) == 1)
        await asyncio.gather(*waiters, return_exceptions=True)

    await running([router], body)


async def test_a_request_arriving_during_the_withdrawal_survives_it(
    pools: FakeCluster,
) -> None:
    """seeds/003 through the shell: the withdrawal is in flight when new demand arrives."""
    router = Router(pools, router_config())

    async def body() -> None:
        first = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: len(pools.writes) == 1)
        pools.write_gate = asyncio.Event()  # the next write is held in flight
        first.cancel()
        await eventually(lambda: pools.attempts[-1].request.member is None)
        assert len(pools.writes) == 1  # the withdrawal is being written, not landed
        second = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: router.sample(
            "modelpool_held_requests", pool="heavy", member="gemma") == 1)
        pools.write_gate.set()
        await eventually(lambda: len(pools.writes) == 3)
        assert [w.request.member for w in pools.writes] == ["gemma", None, "gemma"]
        assert pools.pools["heavy"].request == PoolRequest("gemma", 6, f"{NS}/chat/chat-a")
        pools.set_endpoints("gemma", "127.0.1.4")
        pools.set_pool("heavy", resident_member="gemma")
        assert (await second).base_url == "http://127.0.1.4:8080"
        with pytest.raises(asyncio.CancelledError):
            await first

    await running([router], body)


async def test_an_abandoned_swap_fails_its_waiters_at_once(pools: FakeCluster) -> None:
    router = Router(pools, router_config(budget=30))

    async def body() -> None:
        waiter = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: len(pools.writes) == 1)
        started = time.monotonic()
        pools.set_pool(
            "heavy",
            request=PoolRequest(None, 5, "reconciler"),
            last_swap=LastSwap(
                "coder",
                "gemma",
                4,
                "Abandoned",
                30.0,
                "SwapBudgetExceeded",
                "gemma not Ready within swapBudget",
            ),
        )
        with pytest.raises(ActivationError) as caught:
            await waiter
        assert time.monotonic() - started < 5.0
        assert caught.value.code == "swap_abandoned"
        assert "abandoned" in caught.value.message

    await running([router], body)


async def test_a_connection_failure_re_verifies_residency_at_once(pools: FakeCluster) -> None:
    router = Router(pools, router_config(budget=5))

    async def body() -> None:
        target = await router.call("coder")
        reads, lists = pools.reads, pools.slice_lists
        # The pod is gone out of band; its EndpointSlice has not caught up yet.
        router.activation.report_connect_failure(target)
        await eventually(lambda: pools.reads > reads and pools.slice_lists > lists)
        waiter = asyncio.create_task(router.call("coder"))
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="coder") == 1
        )
        await stays(lambda: not waiter.done())  # no dispatch to the address that just failed
        assert router.activation.model_states()["coder"] == "loading"
        pools.set_endpoints("coder", "127.0.1.3", ready=False)
        pools.set_endpoints("coder", "127.0.1.8")  # the replacement pod is ready
        assert (await waiter).base_url == "http://127.0.1.8:8080"

    await running([router], body)


async def test_three_routers_write_one_request_per_wanted_member(pools: FakeCluster) -> None:
    routers = [Router(pools, router_config(), f"chat-{i}") for i in range(3)]

    async def body() -> None:
        held = [asyncio.create_task(r.call("gemma")) for r in routers for _ in range(4)]
        await eventually(
            lambda: all(
                r.sample("modelpool_held_requests", pool="heavy", member="gemma") == 4
                for r in routers
            )
        )
        # The gauge counts a held request before its router's write has landed: wait for
        # the one request to be written, then check that no second one follows.
        await eventually(lambda: len(pools.requests_for("gemma")) >= 1)
        await stays(lambda: len(pools.requests_for("gemma")) == 1, window=0.1)
        # (That a router which loses the race re-reads and decides again at once is
        # test_a_router_that_loses_the_race_re_reads_and_writes_again_at_once.)
        pools.set_endpoints("gemma", "127.0.1.4")
        pools.set_pool("heavy", resident_member="gemma")
        assert len(await asyncio.gather(*held)) == 12
        assert len(pools.writes) == 1

    await running(routers, body)


async def test_fair_policy_holds_new_requests_for_the_incumbent(pools: FakeCluster) -> None:
    pools.set_pool("heavy", request=PoolRequest("gemma", 4, "demo/chat/chat-z"))
    clock = ManualClock()
    router = Router(pools, router_config(policy="fair"), clock=clock)  # maxWaitSeconds 0.2

    async def body() -> None:
        waiter = asyncio.create_task(router.call("gemma"))
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 1
        )
        assert (await router.call("coder")).backend == "coder"  # before maxWait: admitted
        clock.now += 0.2  # the oldest waiter has waited maxWait
        late = asyncio.create_task(router.call("coder"))
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="coder") == 1
        )
        await stays(lambda: not late.done())  # the incumbent drains
        pools.set_endpoints("gemma", "127.0.1.4")
        pools.set_pool("heavy", resident_member="gemma")
        await waiter
        await eventually(lambda: len(pools.requests_for("coder")) == 1)  # its turn next
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)

    await running([router], body)


async def test_a_config_reload_keeps_held_requests(pools: FakeCluster) -> None:
    router = Router(pools, router_config(budget=30))

    async def body() -> None:
        waiter = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: len(pools.writes) == 1)
        router.activation.update_config(router_config(budget=20))
        await stays(lambda: not waiter.done())
        pools.set_endpoints("gemma", "127.0.1.4")
        pools.set_pool("heavy", resident_member="gemma")
        assert (await waiter).backend == "gemma"

    await running([router], body)


async def test_shutdown_answers_every_held_request(pools: FakeCluster) -> None:
    router = Router(pools, router_config(budget=30))

    async def body() -> None:
        held = [asyncio.create_task(router.call("gemma")) for _ in range(3)]
        await eventually(
            lambda: router.sample("modelpool_held_requests", pool="heavy", member="gemma") == 3
        )
        await router.activation.shutdown(retry_after=7.0)
        results = await asyncio.gather(*held, return_exceptions=True)
        assert [(e.code, e.retry_after) for e in results if isinstance(e, ActivationError)] == [
            ("shutting_down", 7.0)
        ] * 3
        with pytest.raises(ActivationError) as caught:
            await router.call("coder")
        assert caught.value.code == "shutting_down"

    await running([router], body)


async def test_in_flight_requests_are_counted_until_they_end(pools: FakeCluster) -> None:
    router = Router(pools, router_config())

    async def body() -> None:
        async with router.activation.acquire(router.backend("coder")):
            assert router.activation.inflight() == 1
        assert router.activation.inflight() == 0
        pools.delete_endpoints("coder")
        await eventually(lambda: router.activation.model_states()["coder"] == "loading")

    await running([router], body)


async def test_a_router_without_pools_needs_no_api_server() -> None:
    config = router_config()
    activation = Activation(
        config, None, RouterMetrics(CollectorRegistry(), "chat"), identity=f"{NS}/chat/a"
    )
    assert activation.ready()
    external = config.backend("external")
    assert external is not None
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(activation.run())
        async with activation.acquire(external) as target:
            assert target.base_url == "http://127.0.0.9:8000"
        assert not run.done()  # it runs until cancelled, as the proxy's TaskGroup expects
        run.cancel()


async def test_a_pool_added_by_a_reload_starts_from_the_watched_status(
    pools: FakeCluster,
) -> None:
    pools.set_pool("light", resident_member="phi", request=PoolRequest("phi", 1, "x"))
    pools.set_endpoints("phi", "127.0.1.9")
    router = Router(pools, router_config())
    raw_backend = {
        "name": "phi",
        "modelServer": "phi",
        "service": "phi",
        "port": 8080,
        "pool": "light",
        "url": None,
    }
    base = router_config()
    reloaded = replace(
        base,
        backends=(*base.backends, parse_backend(raw_backend)),
        pools=(*base.pools, replace(base.pools[0], name="light", members=("phi",))),
    )

    async def body() -> None:
        router.activation.update_config(reloaded)
        router.config = reloaded
        # the new backend's EndpointSlices come with the watch of the new set of Services
        await eventually(lambda: router.activation.model_states()["phi"] == "resident")
        assert (await router.call("phi")).base_url == "http://127.0.1.9:8080"
        assert pools.writes == []  # resident all along: nothing was asked of the pool

    await running([router], body)


def parse_backend(raw: dict[str, Any]) -> Any:
    config = parse_config(
        {
            "router": {"namespace": NS, "name": "chat"},
            "responseHeaderTimeoutSeconds": 1,
            "maxHeldRequests": 1,
            "backends": [raw],
        }
    )
    return config.backends[0]


class RacedCluster(FakeCluster):
    """Someone else writes the pool's request just before the router's first write lands,
    so that write loses its compare-and-swap."""

    def __init__(self) -> None:
        super().__init__()
        self.raced = False

    async def write_request(self, namespace: str, pool: str, write: WriteRequest) -> PoolStatus:
        if not self.raced:
            self.raced = True
            self.set_pool(pool, request=PoolRequest("coder", 4, f"{NS}/chat/other"))
        return await super().write_request(namespace, pool, write)


async def test_a_router_that_loses_the_race_re_reads_and_writes_again_at_once() -> None:
    """A lost compare-and-swap is not an error: the router re-reads the pool and decides
    again at once. The clock never moves here, so a router that backed off as after a
    failed write would never write again."""
    pools = RacedCluster()
    pools.set_pool("heavy", resident_member="coder", request=PoolRequest("coder", 3, "r"))
    pools.set_endpoints("coder", "127.0.1.3")
    router = Router(pools, router_config(), clock=lambda: 1000.0)

    async def body() -> None:
        reads = pools.reads
        waiter = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: len(pools.requests_for("gemma")) == 1)
        assert pools.conflicts == 1
        assert pools.reads > reads  # it re-read the pool after losing
        [write] = pools.requests_for("gemma")
        assert write.expected is not None and write.expected.generation == 4
        assert pools.pools["heavy"].request == PoolRequest("gemma", 5, f"{NS}/chat/chat-a")
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)

    await running([router], body)


async def test_what_fallback_and_held_streams_ask_of_the_activation(pools: FakeCluster) -> None:
    """serves_now, swap_can_start (activation IfIdle) and hold_progress (held streams), as
    the pool's status and this router's own requests change."""
    router = Router(pools, router_config())
    a = router.activation
    coder, gemma = router.backend("coder"), router.backend("gemma")

    async def body() -> None:
        assert a.serves_now(coder) and not a.serves_now(gemma)
        assert a.serves_now(router.backend("external"))
        assert a.swap_can_start(gemma)  # coder resident, nothing in flight, no swap
        assert a.hold_progress(gemma) == "member stopped"
        async with a.acquire(coder):  # a request in flight on the resident
            assert not a.swap_can_start(gemma)
        assert a.swap_can_start(gemma)
        pools.set_pool("heavy", swap=SwapProgress("coder", "gemma", 4, "Unloading"))
        await eventually(lambda: not a.swap_can_start(gemma))
        assert a.hold_progress(gemma) == "swap phase Unloading"
        crash = "gemma is not starting: container server: CrashLoopBackOff (exited 1)"
        pools.set_pool("heavy", swap=SwapProgress("coder", "gemma", 4, "Loading", crash))
        await eventually(lambda: a.hold_progress(gemma) == f"swap phase Loading: {crash}")

    await running([router], body)


async def test_if_idle_in_a_budgeted_pool_means_it_fits_or_a_victim_is_idle(
    pools: FakeCluster,
) -> None:
    """IfIdle in a pool with a memory budget: a member that fits loads at once; one that
    does not, only while the residents idle through this router free enough room and no
    one waits; never while the room is promised to a load that evicts them already."""
    router = Router(pools, router_config())
    a = router.activation
    coder, gemma = router.backend("coder"), router.backend("gemma")
    gib = 1 << 30
    pools.set_pool("heavy", resident_member="coder", residents=frozenset({"coder"}),
                   room_left=10 * gib, footprints={"coder": 6 * gib, "gemma": 8 * gib})

    async def seen(**changes: Any) -> None:
        pools.set_pool("heavy", **changes)
        await eventually(pools.delivered)

    async def body() -> None:
        await eventually(lambda: a.serves_now(coder))
        assert a.swap_can_start(gemma)  # 8 GiB fits in the 10 left
        async with a.acquire(coder):  # busy, but gemma still fits beside it
            assert a.swap_can_start(gemma)
        await seen(room_left=4 * gib)
        assert a.swap_can_start(gemma)  # coder idle: 4 + 6 >= 8
        async with a.acquire(coder):  # the only victim is busy
            assert not a.swap_can_start(gemma)
        await seen(room_left=1 * gib)
        assert not a.swap_can_start(gemma)  # 1 + 6 < 8
        await seen(room_left=4 * gib,
                   loads=(SwapProgress("coder", "phi", 5, "Draining", None, ("coder",)),))
        assert not a.swap_can_start(gemma)  # coder goes for another
        await seen(room_left=0, loads=(SwapProgress(None, "gemma", 6, "Loading"),))
        assert a.swap_can_start(gemma)  # its load already runs
        # A request held for gemma: while it fits, another loads at once beside it; while
        # it needs a victim, the one held comes first.
        await seen(room_left=10 * gib, loads=())
        held = asyncio.create_task(router.call("gemma"))
        await eventually(lambda: router.sample("modelpool_held_requests", pool="heavy",
                                               member="gemma") == 1)
        assert a.swap_can_start(gemma)
        await seen(room_left=4 * gib)
        assert not a.swap_can_start(gemma)
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)

    await running([router], body)
