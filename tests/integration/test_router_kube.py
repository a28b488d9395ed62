"""The router's Kubernetes adapter (sidecar.kube) against the real API server.

The compare-and-swap of `status.request` (docs/contracts.md section 2) is what makes
several router replicas safe, so it is proven here for real: writers racing from the same
read, exactly one wins per generation, and a stale withdrawal never undoes a newer
request. Watches of ModelPools and EndpointSlices are checked end to end, and three
activators share one pool through the API server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kr8s.asyncio
import pytest
from prometheus_client import CollectorRegistry

from e2e.fake_model.harness import free_port
from e2e.harness import wait_established
from e2e.local.fixtures import Kubectl
from sidecar.activation import Activation
from sidecar.activator import PoolRequest, PoolStatus, WriteRequest
from sidecar.config import RouterConfig, parse_config
from sidecar.kube import KubeClient, connect
from sidecar.kube_port import Changed, Conflict, Listed, WatchEvent
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import config_json, url_backend

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crds" / "modelpool.dev_modelpools.yaml"


@pytest.fixture
def pool(kubectl: Kubectl, namespace: str) -> str:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kubectl, ["modelpools.modelpool.dev"])
    manifest = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "heavy", "namespace": namespace},
        "spec": {"members": [{"name": "coder"}, {"name": "gemma"}], "default": "coder"},
    }
    kubectl("create", "-f", "-", input=json.dumps(manifest))
    return "heavy"


@pytest.fixture
def client(api: kr8s.asyncio.Api) -> KubeClient:
    return KubeClient(api)


async def race(
    client: KubeClient, namespace: str, pool: str, writes: list[WriteRequest]
) -> tuple[list[PoolStatus], int]:
    """Send every write at once; return the winners and the number of conflicts."""
    results = await asyncio.gather(
        *(client.write_request(namespace, pool, w) for w in writes), return_exceptions=True
    )
    unexpected = [
        r for r in results if isinstance(r, BaseException) and not isinstance(r, Conflict)
    ]
    assert unexpected == []
    return [r for r in results if isinstance(r, PoolStatus)], sum(
        isinstance(r, Conflict) for r in results
    )


def ask(member: str | None, read: PoolStatus, by: str) -> WriteRequest:
    current = read.request
    generation = (current.generation if current is not None else 0) + 1
    return WriteRequest(
        PoolRequest(member, generation, by), current, read.resource_version, read.status_present
    )


async def test_racing_writers_exactly_one_wins_per_generation(
    client: KubeClient, namespace: str, pool: str
) -> None:
    read = await client.get_pool(namespace, pool)
    assert read is not None and read.request is None
    for generation in range(1, 6):
        winners, conflicts = await race(
            client,
            namespace,
            pool,
            [ask(m, read, f"{namespace}/chat/{m}-{generation}") for m in ("coder", "gemma", "phi")],
        )
        assert len(winners) == 1 and conflicts == 2
        request = winners[0].request
        assert request is not None and request.generation == generation
        read = await client.get_pool(namespace, pool)
        assert read is not None and read.request == request


async def test_a_stale_withdrawal_never_undoes_a_newer_request(
    client: KubeClient, namespace: str, pool: str
) -> None:
    read = await client.get_pool(namespace, pool)
    assert read is not None
    asked = await client.write_request(namespace, pool, ask("gemma", read, "ns/chat/a"))
    # Router a withdraws from what it read; router b asks for gemma again from the same read.
    withdrawal = ask(None, asked, "ns/chat/a")
    await client.write_request(namespace, pool, ask("gemma", asked, "ns/chat/b"))
    with pytest.raises(Conflict):
        await client.write_request(namespace, pool, withdrawal)
    now = await client.get_pool(namespace, pool)
    assert now is not None and now.request == PoolRequest("gemma", 2, "ns/chat/b")


async def test_the_first_request_into_an_existing_status(
    api: kr8s.asyncio.Api, client: KubeClient, namespace: str, pool: str
) -> None:
    stale = await client.get_pool(namespace, pool)
    assert stale is not None and stale.status_present is False
    # The reconciler writes a status without a request; a write from the old read loses.
    async with api.call_api(
        "PATCH",
        version="modelpool.dev/v1alpha1",
        namespace=namespace,
        url=f"modelpools/{pool}/status",
        content=json.dumps({"status": {"phase": "Cold", "residentMember": None}}),
        headers={"Content-Type": "application/merge-patch+json"},
    ):
        pass
    with pytest.raises(Conflict):
        await client.write_request(namespace, pool, ask("coder", stale, "ns/chat/a"))
    read = await client.get_pool(namespace, pool)
    assert read is not None and read.status_present and read.request is None
    written = await client.write_request(namespace, pool, ask("coder", read, "ns/chat/a"))
    assert written.request == PoolRequest("coder", 1, "ns/chat/a")


async def next_event(events: AsyncIterator[WatchEvent[Any]], within: float = 30.0) -> Any:
    async with asyncio.timeout(within):
        return await anext(events)


async def test_watches_list_then_follow_changes(
    client: KubeClient, kubectl: Kubectl, namespace: str, pool: str
) -> None:
    pools = client.watch_pools(namespace)
    listed = await next_event(pools)
    assert isinstance(listed, Listed) and [p.name for p in listed.items] == [pool]
    read = listed.items[0]
    await client.write_request(namespace, pool, ask("gemma", read, "ns/chat/a"))
    changed = await next_event(pools)
    assert isinstance(changed, Changed) and changed.item.request is not None
    assert changed.item.request.member == "gemma"
    await pools.aclose()  # type: ignore[attr-defined]

    slices = client.watch_endpoint_slices(namespace)
    assert await next_event(slices) == Listed(())
    kubectl("create", "-f", "-", input=json.dumps(endpoint_slice(namespace, "gemma")))
    event = await next_event(slices)
    assert isinstance(event, Changed)
    assert event.item.service == "gemma" and event.item.port == 8080
    assert [(e.address, e.ready) for e in event.item.endpoints] == [
        ("127.0.1.4", True),
        ("127.0.1.5", False),
    ]
    await slices.aclose()  # type: ignore[attr-defined]
    listed_slices = await client.list_endpoint_slices(namespace, "gemma")
    assert [s.name for s in listed_slices] == ["gemma-abc"]
    assert await client.list_endpoint_slices(namespace, "coder") == []


async def test_a_watch_of_named_services_hears_of_no_other_service(
    client: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    kubectl("create", "-f", "-", input=json.dumps(endpoint_slice(namespace, "elsewhere")))
    slices = client.watch_endpoint_slices(namespace, {"gemma", "coder"})
    assert await next_event(slices) == Listed(())
    kubectl("create", "-f", "-", input=json.dumps(endpoint_slice(namespace, "other")))
    kubectl("create", "-f", "-", input=json.dumps(endpoint_slice(namespace, "gemma")))
    event = await next_event(slices)  # the API server filtered `other` out
    assert isinstance(event, Changed) and event.item.service == "gemma"
    await slices.aclose()  # type: ignore[attr-defined]


async def test_a_watch_of_a_named_pool_hears_of_no_other_pool(
    client: KubeClient, kubectl: Kubectl, namespace: str, pool: str
) -> None:
    other = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "other", "namespace": namespace},
        "spec": {"members": [{"name": "elsewhere"}], "default": "elsewhere"},
    }
    kubectl("create", "-f", "-", input=json.dumps(other))
    pools = client.watch_pools(namespace, pool)
    listed = await next_event(pools)
    assert isinstance(listed, Listed) and [p.name for p in listed.items] == [pool]
    kubectl("label", "modelpool", "other", "-n", namespace, "touched=yes")
    kubectl("label", "modelpool", pool, "-n", namespace, "touched=yes")
    changed = await next_event(pools)  # the API server filtered `other` out
    assert isinstance(changed, Changed) and changed.item.name == pool
    await pools.aclose()  # type: ignore[attr-defined]


def endpoint_slice(namespace: str, service: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-abc",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8080}],
        "endpoints": [
            {"addresses": ["127.0.1.4"], "conditions": {"ready": True}},
            {"addresses": ["127.0.1.5"], "conditions": {"ready": False}},
        ],
    }


def router_config(namespace: str) -> RouterConfig:
    def member(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "modelServer": name,
            "service": name,
            "port": 8080,
            "pool": "heavy",
            "url": None,
        }

    return parse_config(
        {
            "router": {"namespace": namespace, "name": "chat"},
            "responseHeaderTimeoutSeconds": 5,
            "maxHeldRequests": 100,
            "backends": [member("coder"), member("gemma")],
            "pools": [
                {
                    "name": "heavy",
                    "members": ["coder", "gemma"],
                    "swapBudgetSeconds": 60,
                }
            ],
        }
    )


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_three_routers_ask_for_a_member_once(
    client: KubeClient, kubectl: Kubectl, namespace: str, pool: str
) -> None:
    config = router_config(namespace)
    registries = [CollectorRegistry() for _ in range(3)]
    routers = [
        Activation(
            config,
            client,
            RouterMetrics(registry, "chat"),
            identity=f"{namespace}/chat/chat-{i}",
        )
        for i, registry in enumerate(registries)
    ]
    gemma = config.backend("gemma")
    assert gemma is not None

    async def call(router: Activation) -> str:
        async with router.acquire(gemma) as target:
            return target.base_url

    async def generation() -> int | None:
        read = await client.get_pool(namespace, pool)
        assert read is not None
        return None if read.request is None else read.request.generation

    async def all_ready() -> bool:
        return all(r.ready() for r in routers)

    async def asked_once() -> bool:
        return await generation() == 1

    async def all_held() -> bool:
        labels = {"router": "chat", "pool": "heavy", "member": "gemma"}
        return all(r.get_sample_value("modelpool_held_requests", labels) == 3 for r in registries)

    async with asyncio.TaskGroup() as tg:
        runs = [tg.create_task(r.run()) for r in routers]
        try:
            await eventually(all_ready)
            held = [tg.create_task(call(r)) for r in routers for _ in range(3)]
            await eventually(asked_once)
            await eventually(all_held)  # every router has decided about its requests
            # Any duplicate write would land within this window: it must stay one request.
            window_ends = time.monotonic() + 1.0
            while time.monotonic() < window_ends:
                assert await generation() == 1
                await asyncio.sleep(0.05)
            # Play the reconciler: gemma becomes resident and its endpoint ready.
            async with client._api.call_api(
                "PATCH",
                version="modelpool.dev/v1alpha1",
                namespace=namespace,
                url=f"modelpools/{pool}/status",
                content=json.dumps({"status": {"residentMember": "gemma"}}),
                headers={"Content-Type": "application/merge-patch+json"},
            ):
                pass
            kubectl("create", "-f", "-", input=json.dumps(endpoint_slice(namespace, "gemma")))
            async with asyncio.timeout(30):
                urls = await asyncio.gather(*held)
            assert set(urls) == {"http://127.0.1.4:8080"}
            assert await generation() == 1
        finally:
            for t in runs:
                t.cancel()


async def test_a_router_whose_waiters_all_left_withdraws_its_request(
    client: KubeClient, namespace: str, pool: str
) -> None:
    config = router_config(namespace)
    router = Activation(
        config, client, RouterMetrics(CollectorRegistry(), "chat"), identity=f"{namespace}/a"
    )
    gemma = config.backend("gemma")
    assert gemma is not None

    async def hold() -> None:
        async with router.acquire(gemma):
            raise AssertionError("gemma is never resident in this test")

    async def request() -> PoolRequest | None:
        read = await client.get_pool(namespace, pool)
        assert read is not None
        return read.request

    async def asked() -> bool:
        return await request() == PoolRequest("gemma", 1, f"{namespace}/a")

    async def withdrawn() -> bool:
        return await request() == PoolRequest(None, 2, f"{namespace}/a")

    async def ready() -> bool:
        return router.ready()

    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(router.run())
        try:
            await eventually(ready)
            waiters = [tg.create_task(hold()) for _ in range(3)]
            await eventually(asked)
            for w in waiters:
                w.cancel()
            await eventually(withdrawn)
        finally:
            run.cancel()


async def test_connect_from_a_kubeconfig(kubeconfig: Path, namespace: str, pool: str) -> None:
    client = await connect(str(kubeconfig))
    try:
        read = await client.get_pool(namespace, pool)
        assert read is not None and read.name == pool
        assert await client.get_pool(namespace, "missing") is None
    finally:
        await client.close()


# --- the router follows its ConfigMap through the API ----------------------------------


async def test_the_router_applies_its_config_map_as_written_not_when_the_file_changes(
    kubeconfig: Path, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """The router process reads its config file at start, then follows the ConfigMap it
    names through the API: a new config applies without the file changing (the kubelet
    refreshes a mounted ConfigMap up to a minute or more later); a broken one is refused
    and the last good one kept; so is a ConfigMap deleted."""

    def config(*names: str) -> str:
        return json.dumps(config_json(
            [url_backend(n, "http://127.0.0.1:9") for n in names],
            router={"namespace": namespace, "name": "edge"}))

    def config_map(content: str) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "edge-config", "namespace": namespace},
                           "data": {"config.json": content}})

    kubectl("apply", "-f", "-", input=config_map(config("alpha")))
    # another router's, beside it: a router follows its own alone
    kubectl("create", "configmap", "other-config", "-n", namespace,
            f"--from-literal=config.json={config('zeta')}")
    path = tmp_path / "config.json"
    path.write_text(config("alpha"))
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar", "--config", str(path), "--config-map", "edge-config",
            "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(metrics_port), "--shutdown-delay", "0",
            cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("MODELPOOL_")},
            stdout=out, stderr=out)
    try:
        async with aiohttp.ClientSession() as http:

            async def models() -> set[str] | None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/v1/models") as r:
                        return {m["id"] for m in (await r.json())["data"]}
                except aiohttp.ClientConnectionError:
                    assert process.returncode is None, log.read_text()
                    return None

            async def lists(*names: str) -> bool:
                return await models() == set(names)

            await eventually(lambda: lists("alpha"), 30)
            # only the ConfigMap changes: nothing here writes the file again
            kubectl("apply", "-f", "-", input=config_map(config("alpha", "beta")))
            await eventually(lambda: lists("alpha", "beta"), 10)

            kubectl("apply", "-f", "-", input=config_map('{"router": '))
            await eventually(lambda: asyncio.to_thread(
                lambda: "keeping the previous ConfigMap" in log.read_text()), 10)
            assert await models() == {"alpha", "beta"}
            kubectl("delete", "configmap", "edge-config", "-n", namespace)
            await eventually(lambda: asyncio.to_thread(
                lambda: "ConfigMap edge-config deleted" in log.read_text()), 10)
            kubectl("apply", "-f", "-", input=config_map(config("gamma")))
            await eventually(lambda: lists("gamma"), 10)
            assert process.returncode is None
    finally:
        if process.returncode is None:
            process.terminate()
        assert await process.wait() == 0, log.read_text()
