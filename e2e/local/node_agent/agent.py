"""The node agent's top level: the Node, its Lease, and the pods bound to it.

One `asyncio.TaskGroup` runs the Lease renewal, the Node heartbeat and the pod watch; a
loop that ends unexpectedly takes the agent down rather than leaving a node that looks
alive and runs nothing. Each pod gets a `PodWorker`; stopping the agent stops every pod
gracefully (the pod objects stay; a restarted agent runs them again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import aiohttp

from e2e.local.node_agent.allocation import Addresses, Devices
from e2e.local.node_agent.kube import ApiError, Kube, NotFound
from e2e.local.node_agent.node import NodeShape, lease_body, micro_time, node_body, node_status
from e2e.local.node_agent.objects import ObjectCache
from e2e.local.node_agent.podspec import Json
from e2e.local.node_agent.settings import AgentSettings
from e2e.local.node_agent.worker import NodeState, PodWorker, WorkerContext
from kubecore import watch

logger = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")


class Agent:
    def __init__(self, settings: AgentSettings, kube: Kube, session: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.kube = kube
        self.objects = ObjectCache(kube, settings.timing.poll_seconds * 2)
        self.context = WorkerContext(
            settings=settings,
            kube=kube,
            session=session,
            objects=self.objects,
            node=NodeState(
                devices=Devices(count=settings.gpus),
                addresses=Addresses(network=settings.pod_network),
            ),
        )
        self.shape = NodeShape(
            name=settings.node_name,
            gpus=settings.gpus,
            cpu=settings.cpu,
            memory=settings.memory,
            pods=settings.max_pods,
            address=settings.host_ip,
            unschedulable=settings.unschedulable,
        )
        self.workers: dict[str, PodWorker] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        # Pods whose worker has ended: a late event must not start them again.
        self.finished: set[str] = set()
        self.ready_since = time.time()
        self.node_uid = ""

    async def run(self, stop: asyncio.Event) -> None:
        """Register the node, then serve until `stop` is set; then stop every pod."""
        await self.register()
        try:
            async with asyncio.TaskGroup() as group:
                loops = [
                    group.create_task(self._renew_lease()),
                    group.create_task(self._heartbeat()),
                    group.create_task(self._watch_pods()),
                    group.create_task(self.objects.run()),
                ]
                await stop.wait()
                logger.info("stopping: terminating %s pods", len(self.workers))
                for task in loops:
                    task.cancel()
        finally:
            await self.stop_pods()

    async def register(self) -> None:
        delay = self.settings.timing.poll_seconds
        while True:
            try:
                node = await self.kube.ensure_node(node_body(self.shape))
                self.node_uid = node["metadata"]["uid"]
                await self._post_status()
                await self.kube.renew_lease(self._lease())
                logger.info("node %s registered with %s GPUs", self.shape.name, self.shape.gpus)
                return
            except ApiError as error:
                logger.warning("node registration failed, retrying: %s", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _lease(self) -> Json:
        return lease_body(
            self.shape.name, self.node_uid, self.settings.timing.lease_seconds,
            micro_time(time.time()),
        )

    async def _post_status(self) -> None:
        await self.kube.patch_node_status(
            self.shape.name, node_status(self.shape, time.time(), self.ready_since)
        )

    async def _renew_lease(self) -> None:
        while True:
            await asyncio.sleep(self.settings.timing.lease_renew_seconds)
            try:
                await self.kube.renew_lease(self._lease())
            except ApiError as error:
                logger.warning("lease renewal failed: %s", error)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.timing.node_status_seconds)
            try:
                await self._post_status()
            except NotFound:
                logger.warning("node %s was deleted; registering it again", self.shape.name)
                await self.register()
            except ApiError as error:
                logger.warning("node status update failed: %s", error)

    async def _watch_pods(self) -> None:
        """List, then watch from the list's version; relist after 410 Gone or an error."""
        node = self.shape.name
        retry = watch.Retry(
            delay=lambda _: self.settings.timing.poll_seconds * 2, failures=(ApiError,)
        )
        changes = watch.list_then_watch(
            lambda: self.kube.list_pods(node),
            lambda version: self.kube.watch_pods(node, version),
            what="pods",
            retry=retry,
            logger=logger,
        )
        async with watch.closing(changes):
            async for change in changes:
                if isinstance(change, watch.Listed):
                    self._sync(change.items)
                elif change.type in ("ADDED", "MODIFIED"):
                    self._upsert(change.object)
                elif change.type == "DELETED":
                    self._vanish(change.object["metadata"]["uid"])

    def _sync(self, pods: Sequence[Json]) -> None:
        present = {pod["metadata"]["uid"] for pod in pods}
        for uid in list(self.workers):
            if uid not in present:
                self._vanish(uid)
        for pod in pods:
            self._upsert(pod)

    def _upsert(self, pod: Json) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        if uid in self.finished:
            return
        deleting = bool(pod["metadata"].get("deletionTimestamp"))
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES and not deleting:
            return
        worker = PodWorker(self.context, pod)
        worker.update(pod)
        self.workers[uid] = worker
        self.tasks[uid] = asyncio.create_task(self._run_worker(uid, worker))

    async def _run_worker(self, uid: str, worker: PodWorker) -> None:
        try:
            await worker.run()
        finally:
            self.finished.add(uid)
            self.workers.pop(uid, None)
            self.tasks.pop(uid, None)

    def _vanish(self, uid: str) -> None:
        worker = self.workers.get(uid)
        if worker is not None:
            worker.vanish()

    async def stop_pods(self) -> None:
        for worker in list(self.workers.values()):
            worker.shutdown()
        tasks = list(self.tasks.values())
        if tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks)
