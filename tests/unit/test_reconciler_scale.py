"""What one object's reconcile or watch event costs does not grow with the objects beside
it: the caches answer "which pools hold this server", "which pods are this server's" and
"which routers front it" from indexes (`reconciler.kube.IndexedCache`), a pool's spec
change wakes only the pools that share a member with it, and a router renders from its
own backends. Each test builds a namespace of one pool and of many, and compares.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.controller import Controller
from reconciler.kube import IndexedCache, Informer, label_indexer
from reconciler.stores import POOL, ROUTER, SERVER, Key
from tests.unit.test_swap_shell import NS, FakeKube, controller, pod, queued, server

pytestmark = pytest.mark.unit

GROUP = "modelpool.dev/v1alpha1"


def pool(name: str, members: list[str], generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": GROUP, "kind": "ModelPool",
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}",
                     "generation": generation, "resourceVersion": "1"},
        "spec": {"members": [{"name": m} for m in members], "default": members[0],
                 "swapBudget": "300s"},
    }


def router(name: str, members: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": GROUP, "kind": "ModelRouter",
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}", "generation": 1},
        "spec": {"backends": [{"name": m, "modelServerRef": {"name": m}} for m in members],
                 "defaultRoute": members[0]},
    }


def crowded(kube: FakeKube, others: int) -> Controller:
    """The shell's pool `slot` (members a, b; a's pod runs) with `others` more pools of
    three members each, their first member's pod running, and a router fronting each."""
    c = controller(kube, [pod("a")])
    for n in range(others):
        members = [f"p{n}-m{i}" for i in range(3)]
        for m in members:
            c.servers.cache[(NS, m)] = server(m)
        c.pools.cache[(NS, f"p{n}")] = pool(f"p{n}", members)
        c.routers.cache[(NS, f"r{n}")] = router(f"r{n}", members)
        running = pod(members[0])
        c.pods.cache[(NS, running["metadata"]["name"])] = running
    return c


class Scans:
    """Counts the objects every `Informer.items` call returns: a scan of a cache."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.visited = 0
        original = Informer.items

        def counted(informer: Informer, namespace: str | None = None) -> list[dict[str, Any]]:
            found = original(informer, namespace)
            self.visited += len(found)
            return found

        monkeypatch.setattr(Informer, "items", counted)


async def reconcile_all(c: Controller) -> None:
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await c.router_reconciler.reconcile(Key(ROUTER, NS, "chat"))
    c.ctx.background.cancel()


async def test_a_reconcile_sends_the_same_requests_and_scans_nothing_however_many_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alone, beside_many = FakeKube(), FakeKube()
    lone, busy = crowded(alone, 0), crowded(beside_many, 200)
    scans = Scans(monkeypatch)
    await reconcile_all(lone)
    await reconcile_all(busy)
    assert alone.calls and beside_many.calls == alone.calls
    assert scans.visited == 0


async def test_a_pod_event_wakes_its_server_and_pool_without_a_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = crowded(FakeKube(), 200)
    queued(c)
    scans = Scans(monkeypatch)
    c._on_pod("MODIFIED", pod("p7-m0"))
    assert queued(c) == {Key(POOL, NS, "p7"), Key(SERVER, NS, "p7-m0")}
    c._on_server("MODIFIED", server("p7-m1"))
    assert queued(c) == {Key(SERVER, NS, "p7-m1"), Key(POOL, NS, "p7"), Key(ROUTER, NS, "r7")}
    assert scans.visited == 0


def test_a_new_pool_wakes_the_pools_sharing_its_members_and_no_other() -> None:
    c = crowded(FakeKube(), 50)
    queued(c)
    sharing = pool("sharing", ["p3-m2", "fresh"])
    c.pools.cache[(NS, "sharing")] = sharing
    c._on_pool("ADDED", sharing)
    assert {k for k in queued(c) if k.kind == POOL} == {Key(POOL, NS, "sharing"),
                                                       Key(POOL, NS, "p3")}


def test_a_pool_that_gives_up_a_shared_member_wakes_the_pool_that_keeps_it() -> None:
    c = crowded(FakeKube(), 50)
    sharing = pool("sharing", ["p3-m2", "fresh"])
    c.pools.cache[(NS, "sharing")] = sharing
    c._on_pool("ADDED", sharing)
    queued(c)
    changed = pool("sharing", ["fresh"], generation=2)
    c.pools.cache[(NS, "sharing")] = changed
    c._on_pool("MODIFIED", changed)
    assert {k for k in queued(c) if k.kind == POOL} == {Key(POOL, NS, "sharing"),
                                                       Key(POOL, NS, "p3")}


def test_the_index_follows_every_write_of_the_cache() -> None:
    cache = IndexedCache({"app": label_indexer("app")})

    def obj(name: str, app: str | None) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"app": app} if app else {}}}

    cache[(NS, "x")] = obj("x", "one")
    cache[(NS, "y")] = obj("y", "one")
    cache[("other", "z")] = obj("z", "one")
    assert [o["metadata"]["name"] for o in cache.indexed("app", NS, "one")] == ["x", "y"]
    cache[(NS, "x")] = obj("x", "two")  # relabelled: filed under its new value only
    assert [o["metadata"]["name"] for o in cache.indexed("app", NS, "one")] == ["y"]
    assert [o["metadata"]["name"] for o in cache.indexed("app", NS, "two")] == ["x"]
    cache.pop((NS, "y"))
    del cache[(NS, "x")]
    cache[(NS, "w")] = obj("w", None)
    assert cache.indexed("app", NS, "one") == cache.indexed("app", NS, "two") == []
    assert [o["metadata"]["name"] for o in cache.indexed("app", "other", "one")] == ["z"]
    assert cache.pop((NS, "gone"), None) is None
