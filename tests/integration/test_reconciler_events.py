"""The reconciler's Events on the real API server (reconciler/writes.py `post_event`): an
Event repeated about the same object, with the same type, reason and message, is counted
on the one posted (`count`, `lastTimestamp`), as client-go's recorder does, so a
condition that comes and goes shows once in `kubectl describe`; another message, another
object or a repeat after the series window is an Event of its own."""

from __future__ import annotations

from typing import Any

import kr8s.asyncio
import pytest
from prometheus_client import CollectorRegistry

from e2e.local.fixtures import Kubectl
from reconciler import writes
from reconciler.kube import Kube
from reconciler.metrics import ReconcilerMetrics
from reconciler.writes import Writer

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def config_map(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"}}


def events(kubectl: Kubectl, namespace: str) -> list[tuple[str, str, int]]:
    items = kubectl.json("get", "events", "-n", namespace)["items"]
    return sorted((e["involvedObject"]["name"], e["message"], e["count"]) for e in items)


async def test_an_event_repeated_is_counted_on_the_one_posted(
    api: kr8s.asyncio.Api, kubectl: Kubectl, namespace: str
) -> None:
    clock = Clock()
    no_stores: Any = None  # posting an Event reads no cache
    writer = Writer(Kube(api), ReconcilerMetrics(CollectorRegistry()), no_stores, clock, "test",
                    30.0)
    pool, other = config_map(namespace, "gpu0"), config_map(namespace, "gpu1")
    await writer.post_event(pool, "Warning", "Unschedulable", "0/1 nodes are available")
    clock.now += 1
    await writer.post_event(pool, "Warning", "Unschedulable", "0/1 nodes are available")
    await writer.post_event(pool, "Warning", "Unschedulable", "another message")
    await writer.post_event(other, "Warning", "Unschedulable", "0/1 nodes are available")
    assert events(kubectl, namespace) == [
        ("gpu0", "0/1 nodes are available", 2),
        ("gpu0", "another message", 1),
        ("gpu1", "0/1 nodes are available", 1),
    ]
    counted = [e for e in kubectl.json("get", "events", "-n", namespace)["items"]
               if e["count"] == 2]
    assert [(e["firstTimestamp"], e["lastTimestamp"]) for e in counted] == [
        ("2027-01-15T08:00:00Z", "2027-01-15T08:00:01Z")]
    # past the series window: an Event of its own
    clock.now += writes.EVENT_SERIES_SECONDS
    await writer.post_event(pool, "Warning", "Unschedulable", "0/1 nodes are available")
    assert ("gpu0", "0/1 nodes are available", 1) in events(kubectl, namespace)
    # an Event gone from the API server (expired, deleted) is posted anew
    kubectl("delete", "events", "--all", "-n", namespace)
    clock.now += 1
    await writer.post_event(other, "Warning", "Unschedulable", "0/1 nodes are available")
    assert events(kubectl, namespace) == [("gpu1", "0/1 nodes are available", 1)]
