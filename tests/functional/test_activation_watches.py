"""What a router watches: the EndpointSlices of its own backends' Services, not every
Service of its namespace (a router fronting one pool among hundreds hears of no other's
endpoints), and again those of the new set when its config changes the backends; and its
own ModelPools, each by name, not every ModelPool of the namespace."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.activation import MAX_SELECTED_SERVICES
from sidecar.config import RouterConfig
from sidecar.pool_watches import MAX_NAMED_POOLS
from tests.functional.test_activation import Router, eventually, router_config, running
from tests.kube_fake import FakeCluster

pytestmark = pytest.mark.functional


def with_pool(config: RouterConfig, name: str) -> RouterConfig:
    heavy = config.pools[0]
    return replace(config, pools=(*config.pools, replace(heavy, name=name, members=())))


def without_pool(config: RouterConfig, name: str) -> RouterConfig:
    return replace(config, pools=tuple(p for p in config.pools if p.name != name))


def with_backend(config: RouterConfig, name: str) -> RouterConfig:
    coder = config.backend("coder")
    assert coder is not None
    extra = replace(coder, name=name, model_server=name, service=name, pool=None)
    return replace(config, backends=(*config.backends, extra))


@pytest.fixture
def pools() -> FakeCluster:
    c = FakeCluster()
    c.set_pool("heavy", resident_member="coder")
    c.set_endpoints("coder", "127.0.1.3")
    c.set_endpoints("elsewhere", "127.0.1.9")  # another router's backend
    return c


async def test_a_router_watches_the_endpoint_slices_of_its_backends_alone(
    pools: FakeCluster,
) -> None:
    router = Router(pools, router_config())

    async def body() -> None:
        assert pools.slice_watches == [frozenset({"coder", "gemma"})]
        pools.set_endpoints("elsewhere", "127.0.1.10")
        pools.set_endpoints("gemma", "127.0.1.4")
        await eventually(lambda: "gemma" in router.activation._endpoints.services())
        assert router.activation._endpoints.services() == {"coder", "gemma"}

    await running([router], body)


async def test_a_new_backend_restarts_the_watch_on_the_new_set(pools: FakeCluster) -> None:
    router = Router(pools, router_config())
    pools.set_endpoints("third", "127.0.1.5")

    async def body() -> None:
        router.activation.update_config(with_backend(router.config, "third"))
        await eventually(lambda: len(pools.slice_watches) == 2)
        assert pools.slice_watches[-1] == frozenset({"coder", "gemma", "third"})
        await eventually(lambda: "third" in router.activation._endpoints.services())
        router.activation.update_config(with_backend(router.config, "third"))
        assert len(pools.slice_watches) == 2  # the same Services: the watch goes on

    await running([router], body)


async def test_a_router_of_too_many_services_watches_the_namespace(
    pools: FakeCluster,
) -> None:
    config = router_config()
    for n in range(MAX_SELECTED_SERVICES):
        config = with_backend(config, f"extra-{n}")
    router = Router(pools, config)

    async def body() -> None:
        assert pools.slice_watches == [None]

    await running([router], body)


async def test_a_router_watches_its_own_pools_by_name_and_hears_of_no_other(
    pools: FakeCluster,
) -> None:
    pools.set_pool("other", resident_member="elsewhere")  # another router's pool
    router = Router(pools, router_config())

    async def body() -> None:
        assert pools.pool_watches == ["heavy"]
        pools.set_pool("other", resident_member=None)
        pools.set_pool("heavy", resident_member="gemma")
        await eventually(lambda: router.activation._seen["heavy"].resident_member == "gemma")
        assert set(router.activation._seen) == {"heavy"}

    await running([router], body)


async def test_a_pool_added_to_the_config_is_watched_and_one_removed_is_forgotten(
    pools: FakeCluster,
) -> None:
    pools.set_pool("light", resident_member=None)
    router = Router(pools, router_config())

    async def body() -> None:
        both = with_pool(router.config, "light")
        router.activation.update_config(both)
        await eventually(lambda: "light" in router.activation._seen)
        assert sorted(n for n in pools.pool_watches if n) == ["heavy", "light"]
        router.activation.update_config(both)
        assert len(pools.pool_watches) == 2  # the same pools: the watches go on
        router.activation.update_config(without_pool(both, "heavy"))
        await eventually(lambda: "heavy" not in router.activation._seen)
        pools.set_pool("heavy", resident_member="gemma")
        pools.set_pool("light", resident_member="coder")
        await eventually(lambda: router.activation._seen["light"].resident_member == "coder")
        assert "heavy" not in router.activation._seen  # its watch stopped

    await running([router], body)


async def test_a_router_of_too_many_pools_watches_the_namespace(pools: FakeCluster) -> None:
    config = router_config()
    for n in range(MAX_NAMED_POOLS):
        config = with_pool(config, f"extra-{n}")
    router = Router(pools, config)

    async def body() -> None:
        assert pools.pool_watches == [None]

    await running([router], body)


async def test_a_router_is_not_ready_before_its_pool_watch_listed(pools: FakeCluster) -> None:
    router = Router(pools, router_config())
    assert not router.activation.ready()

    async def body() -> None:
        assert router.activation.ready()
        assert router.activation._seen["heavy"].resident_member == "coder"

    await running([router], body)


async def test_a_router_of_no_pool_watches_none_and_is_ready(pools: FakeCluster) -> None:
    config = replace(router_config(), pools=())
    router = Router(pools, config)

    async def body() -> None:
        assert router.activation.ready()
        assert pools.pool_watches == []

    await running([router], body)
