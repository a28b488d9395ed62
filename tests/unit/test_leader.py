"""Lease election over a fake of our own `Kube` port, with a fake clock: a live holder
is respected, a silent one is replaced only after a whole lease duration by the
candidate's own clock, a lost race is not a win, and release hands the Lease back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reconciler.kube import Conflict, Kube
from reconciler.leader import LeaderElector
from reconciler.settings import LeaderSettings

pytestmark = pytest.mark.unit


class FakeLeases(Kube):
    """One Lease, with resourceVersion checks as the API server makes them."""

    def __init__(self) -> None:
        super().__init__(api=None)
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.race = False  # the next replace loses to another writer

    async def get(self, resource: Any, namespace: Any, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    async def create(self, resource: Any, namespace: Any, body: Any) -> dict[str, Any]:
        if self.lease is not None:
            raise Conflict("exists", 409)
        return self._store(body)

    async def replace(self, resource: Any, namespace: Any, name: str, body: Any) -> dict[str, Any]:
        assert self.lease is not None
        if self.race or body["metadata"].get("resourceVersion") != str(self.version):
            self.race = False
            raise Conflict("stale", 409)
        return self._store(body)

    def _store(self, body: Any) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(dict(body))
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    @property
    def holder(self) -> str:
        return str(((self.lease or {}).get("spec") or {}).get("holderIdentity") or "")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(kube: FakeLeases, identity: str, clock: Clock) -> LeaderElector:
    settings = LeaderSettings(enabled=True, identity=identity, lease_seconds=10)
    return LeaderElector(kube, settings, clock=clock, monotonic=clock)


async def test_a_live_holder_is_respected_and_a_silent_one_replaced_after_a_duration() -> None:
    kube, clock = FakeLeases(), Clock()
    one, two = elector(kube, "one", clock), elector(kube, "two", clock)
    assert await one.try_acquire_or_renew()
    assert kube.holder == "one"
    assert not await two.try_acquire_or_renew()  # first sight: the clock starts now
    for _ in range(3):  # "one" renews: "two" keeps waiting however long it watches
        clock.now += 8
        assert await one.try_acquire_or_renew()
        assert not await two.try_acquire_or_renew()
    clock.now += 9  # "one" fell silent 9 s ago
    assert not await two.try_acquire_or_renew()
    clock.now += 2
    assert await two.try_acquire_or_renew()
    assert kube.holder == "two"
    assert kube.lease is not None and kube.lease["spec"]["leaseTransitions"] == 1


async def test_a_lost_race_is_not_a_win() -> None:
    kube, clock = FakeLeases(), Clock()
    one = elector(kube, "one", clock)
    assert await one.try_acquire_or_renew()
    kube.race = True
    assert not await one.try_acquire_or_renew()


async def test_release_hands_the_lease_over_at_once() -> None:
    kube, clock = FakeLeases(), Clock()
    one, two = elector(kube, "one", clock), elector(kube, "two", clock)
    await one.acquire()
    assert one.leading
    await one.release()
    assert kube.holder == "" and not one.leading
    assert await two.try_acquire_or_renew()  # no need to wait the duration out
