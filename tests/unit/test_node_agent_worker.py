"""A pod worker's side tasks are supervised: a status writer that fails for a reason
other than the API server's answer fails the pod at once, instead of dying unseen while
the pod keeps running with a status nobody updates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from e2e.local.node_agent.allocation import Addresses, Devices
from e2e.local.node_agent.kube import ApiError, Kube
from e2e.local.node_agent.objects import ObjectCache
from e2e.local.node_agent.settings import AgentSettings, ApiServer, Timing
from e2e.local.node_agent.worker import NodeState, PodWorker, WorkerContext

pytestmark = pytest.mark.unit


class BrokenOnceKube:
    """Only what a worker of a pod with an unknown image calls; the first status write
    raises an error that is not an ApiError (a fault of the agent itself)."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.broken = True

    async def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if self.broken:
            self.broken = False
            raise RuntimeError("status writer fault")
        self.statuses.append(body)

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        return None

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        return None


def worker_context(kube: object, state_dir: Path, timing: Timing) -> WorkerContext:
    """A pod worker's context around `kube`, a stand-in for the agent's API adapter."""
    settings = AgentSettings(
        kubeconfig="", node_name="local", gpus=1, state_dir=state_dir, python="python3",
        api_server=ApiServer("https://127.0.0.1:6443", ""), timing=timing,
    )
    return WorkerContext(
        settings=settings,
        kube=cast(Kube, kube),
        session=cast(Any, None),
        node=NodeState(Devices(count=1), Addresses()),
        objects=cast(ObjectCache, None),
    )

async def test_a_failed_status_writer_fails_the_pod_at_once(tmp_path: Path) -> None:
    kube = BrokenOnceKube()
    context = worker_context(kube, tmp_path, Timing())
    pod = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": "example/unknown:1"}]},
    }
    worker = PodWorker(context, pod)
    task = asyncio.create_task(worker.run())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while not kube.statuses:
            assert asyncio.get_running_loop().time() < deadline, "no status was written"
            await asyncio.sleep(0.01)
        assert worker.failure is not None
        assert worker.failure.reason == "NodeAgentError"
        assert "status writer fault" in worker.failure.message
    finally:
        worker.vanish()
        async with asyncio.timeout(10):
            await task


class FlakyDeleteKube:
    """The API server drops the first delete of the pod object (a ReadError under load)."""

    def __init__(self) -> None:
        self.deletes = 0

    async def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        return None

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        return None

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        self.deletes += 1
        if self.deletes == 1:
            raise ApiError(0, "ReadError")


async def test_a_failed_delete_of_the_pod_object_is_tried_again(tmp_path: Path) -> None:
    kube = FlakyDeleteKube()
    context = worker_context(kube, tmp_path, Timing(poll_seconds=0.01))
    meta = {"namespace": "ns", "name": "p", "uid": "u1"}
    spec = {"containers": [{"name": "c", "image": "example/unknown:1"}]}
    worker = PodWorker(context, {"metadata": meta, "spec": spec})
    task = asyncio.create_task(worker.run())
    worker.update({"metadata": {**meta, "deletionTimestamp": "2026-11-30T12:00:00Z"},
                   "spec": spec})
    async with asyncio.timeout(10):
        await task
    assert kube.deletes == 2  # once dropped, once done
