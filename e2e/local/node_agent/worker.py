"""One pod's life on the local node, from binding to deletion.

A `PodWorker` is the async shell around the pure parts: it allocates the pod's address
and GPUs, writes its volumes and kubeconfig, runs each container as a process under
its restart policy and probes, reports status when it changes, and on deletion stops
the processes (SIGTERM, SIGKILL after the grace period) before it releases the GPUs
and removes the pod object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from e2e.local.node_agent import files, processes, restarts
from e2e.local.node_agent.allocation import Addresses, Devices
from e2e.local.node_agent.images import PROGRAMS, image_repository, program_for
from e2e.local.node_agent.kube import ApiError, Kube
from e2e.local.node_agent.logs import PodLogger
from e2e.local.node_agent.node import event_body
from e2e.local.node_agent.objects import ObjectCache
from e2e.local.node_agent.pod_files import PodFiles, all_containers
from e2e.local.node_agent.podspec import (
    ConfigError,
    Json,
    PodFacts,
    container_argv,
    container_env,
    gpu_request,
    pod_facts,
    rewrite_env,
)
from e2e.local.node_agent.probe_http import probe_once
from e2e.local.node_agent.probes import ProbeSpec, ProbeState, probe_spec, step
from e2e.local.node_agent.settings import AgentSettings
from e2e.local.node_agent.status import (
    ContainerRuntime,
    PodFailure,
    Terminated,
    pod_status,
    rfc3339,
)

logger = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass
class NodeState:
    """The node's current allocations; the agent's single mutable holder of them."""

    devices: Devices
    addresses: Addresses


@dataclass(frozen=True)
class WorkerContext:
    settings: AgentSettings
    kube: Kube
    session: aiohttp.ClientSession
    node: NodeState
    objects: ObjectCache


def pod_dir_name(pod: Json) -> str:
    meta = pod["metadata"]
    return f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def _first_leaf(error: BaseException) -> BaseException:
    """The first error inside (nested) TaskGroup exception groups: what a person reads."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


class PodWorker:
    def __init__(self, context: WorkerContext, pod: Json) -> None:
        meta = pod["metadata"]
        self.context = context
        self.pod = pod
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.log = PodLogger(logger, {"pod": f"{self.namespace}/{self.name}"})
        self.directory = context.settings.pods_dir / pod_dir_name(pod)
        self.terminate = asyncio.Event()
        self.delete_when_stopped = True
        self.changed = asyncio.Event()
        self.runtimes: dict[str, ContainerRuntime] = {}
        self.init_runtimes: dict[str, ContainerRuntime] = {}
        self.failure: PodFailure | None = None
        self.pod_ip = ""
        status = pod.get("status") or {}
        self.start_time: str = status.get("startTime") or rfc3339(time.time())
        self.last_written: dict[str, Any] | None = None
        self.gpus: dict[str, tuple[int, ...]] = {}
        self.pod_files = PodFiles(
            context.kube, context.objects, context.settings, self.directory, self.log
        )
        self.live: set[processes.Process] = set()
        self.event_tasks: set[asyncio.Task[None]] = set()
        self.last_event: tuple[str, str] | None = None

    # Events from the agent

    def update(self, pod: Json) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.terminate.set()

    def vanish(self) -> None:
        """The pod is gone from the API: stop its processes, delete nothing."""
        self.delete_when_stopped = False
        self.terminate.set()

    def shutdown(self) -> None:
        """The agent is stopping: stop the processes gracefully, keep the pod object."""
        self.delete_when_stopped = False
        self.terminate.set()

    # Lifecycle

    @property
    def spec(self) -> Json:
        spec: Json = self.pod["spec"]
        return spec

    def all_containers(self) -> list[Json]:
        return all_containers(self.pod)

    def grace_seconds(self) -> float:
        meta_grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        grace = meta_grace if meta_grace is not None else self.spec.get(
            "terminationGracePeriodSeconds", 30
        )
        if not self.delete_when_stopped:
            grace = min(float(grace), 5.0)
        return float(grace)

    async def run(self) -> None:
        try:
            try:
                await self._run()
            except Exception as error:
                # A fault of the agent itself: fail the pod loudly, keep it until deleted.
                self.log.exception("pod worker failed")
                cause = _first_leaf(error)
                await self._fail(f"node agent error: {type(cause).__name__}: {cause}")
        finally:
            # Only once every process has exited does the pod give up its GPUs.
            for process in list(self.live):
                await process.stop(0)
            self.release_gpus()
            node = self.context.node
            node.addresses = node.addresses.release(self.uid)
        if self.event_tasks:
            await asyncio.gather(*self.event_tasks, return_exceptions=True)
        if self.delete_when_stopped:
            self.log.info("processes stopped; deleting the pod object")
            await self._delete_pod_object()

    async def _delete_pod_object(self) -> None:
        """Delete the pod object at once, as the kubelet does once the containers have
        stopped. A failed delete is tried again with backoff: a pod left terminating
        for ever would hold up whoever waits for it to go (a pool's swap, a namespace's
        deletion). It stops when the pod is gone or the agent stops."""
        delay = self.context.settings.timing.poll_seconds
        while self.delete_when_stopped:
            try:
                await self.context.kube.delete_pod_now(self.namespace, self.name, self.uid)
                return
            except ApiError as error:
                self.log.warning("could not delete the pod (again in %.1fs): %s", delay, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _run(self) -> None:
        node = self.context.node
        previous_ip = (self.pod.get("status") or {}).get("podIP", "")
        node.addresses, self.pod_ip = node.addresses.allocate(self.uid, previous_ip)
        previous = {
            s["name"]: s for s in (self.pod.get("status") or {}).get("containerStatuses") or []
        }
        for container in self.spec["containers"]:
            self.runtimes[container["name"]] = ContainerRuntime(
                name=container["name"],
                image=container["image"],
                image_id=f"local://{image_repository(container['image'])}",
                restart_count=int(previous.get(container["name"], {}).get("restartCount", 0)),
            )
        for container in self.spec.get("initContainers") or []:
            self.init_runtimes[container["name"]] = ContainerRuntime(
                name=container["name"],
                image=container["image"],
                image_id=f"local://{image_repository(container['image'])}",
            )
        if self.terminate.is_set():
            return
        # The status writer and the volume syncer run beside the pod's lifecycle in one
        # TaskGroup: if either fails, the lifecycle is cancelled and `run` fails the pod
        # at once, rather than the pod silently losing its status or its files.
        async with asyncio.TaskGroup() as side:
            # Every status write goes through this one task, which retries failed writes.
            side_tasks = [side.create_task(self._status_writer(), name="status-writer")]
            self.changed.set()
            try:
                await self._lifecycle(side, side_tasks)
            finally:
                for task in side_tasks:
                    task.cancel()

    async def _lifecycle(
        self, side: asyncio.TaskGroup, side_tasks: list[asyncio.Task[None]]
    ) -> None:
        settings = self.context.settings
        unknown = [c for c in self.all_containers()
                   if program_for(c["image"], c.get("command") or ()) is None]
        if unknown:
            self._fail_unknown_images(unknown)
            await self.terminate.wait()
            return
        files.ensure_dir(self.directory)
        files.ensure_dir(settings.gpu_lock_dir)
        if not await self._allocate_gpus():
            return
        if not await self._prepare_volumes():
            return
        side_tasks.append(side.create_task(self._keep_volumes_current(), name="volume-syncer"))
        if await self._run_init_containers():
            async with asyncio.TaskGroup() as group:
                for container in self.spec["containers"]:
                    group.create_task(self._supervise(container))
        # Every container has ended for good (restartPolicy Never/OnFailure, or a
        # failed init container): the final phase is reported, the pod kept until
        # it is deleted.
        await self.terminate.wait()

    async def _fail(self, message: str) -> None:
        for process in list(self.live):
            await process.stop(self.grace_seconds())
        self.failure = PodFailure(reason="NodeAgentError", message=message[:500])
        try:
            await self._write_status()
        except ApiError as error:
            self.log.error("could not report the failure: %s", error)
        await self.terminate.wait()

    def _fail_unknown_images(self, unknown: list[Json]) -> None:
        known = ", ".join(sorted(PROGRAMS))
        names = ", ".join(f'"{c["image"]}"' for c in unknown)
        message = (
            f"image {names} is not known to the local node agent "
            f"(it runs images of: {known})"
        )
        self.log.error("%s", message)
        self._event("Warning", "Failed", message)
        self.failure = PodFailure(reason="UnknownImage", message=message)
        for container in unknown:
            runtimes = self.runtimes if container["name"] in self.runtimes else self.init_runtimes
            runtimes[container["name"]] = replace(
                runtimes[container["name"]],
                reason="UnknownImage",
                message=f'image "{container["image"]}" is not known to the local node agent',
            )
        self.changed.set()

    async def _allocate_gpus(self) -> bool:
        """Give each container its devices; waits while the node has too few free (the
        scheduler normally prevents that). False when the pod was deleted meanwhile."""
        node = self.context.node
        for container in self.spec["containers"]:
            wanted = gpu_request(container, GPU_RESOURCE)
            if not wanted:
                continue
            key = f"{self.uid}/{container['name']}"
            while True:
                node.devices, ids = node.devices.allocate(key, wanted)
                if ids is not None:
                    self.gpus[container["name"]] = ids
                    break
                self.log.warning("waiting for %s free GPUs", wanted)
                if await self._wait_terminate(self.context.settings.timing.poll_seconds * 4):
                    return False
        return True

    def release_gpus(self) -> None:
        node = self.context.node
        for name in self.gpus:
            node.devices = node.devices.release(f"{self.uid}/{name}")

    async def _wait_terminate(self, seconds: float) -> bool:
        """Wait up to `seconds`; True when termination was asked for meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.terminate.wait()
        return self.terminate.is_set()

    # Volumes, tokens and the kubeconfig

    def facts(self) -> PodFacts:
        return pod_facts(self.pod, self.pod_ip, self.context.settings.host_ip)

    async def _prepare_volumes(self) -> bool:
        """Write every volume; while a referenced object is missing, report it and retry.
        False when the pod was deleted meanwhile."""
        while True:
            try:
                await self.pod_files.sync(self.pod, self.facts())
                return True
            except (ConfigError, ApiError) as error:
                self.log.warning("cannot prepare volumes: %s", error)
                self._event("Warning", "FailedMount", str(error))
                for name, runtime in self.runtimes.items():
                    self.runtimes[name] = replace(
                        runtime, reason="ContainerCreating", message=str(error)[:300]
                    )
                self.changed.set()
            if await self._wait_terminate(self.context.settings.timing.poll_seconds * 4):
                return False

    async def _keep_volumes_current(self) -> None:
        """ConfigMap and Secret volumes follow their objects as soon as the cache sees a
        change (the kubelet takes up to a minute); downward-API files and projected
        tokens (renewed at 80% of their lifetime) are checked every few seconds."""
        period = self.context.settings.timing.volume_sync_seconds
        objects = self.context.objects
        seen = objects.version
        while True:
            seen = await objects.wait_for_change(seen, at_most=period)
            try:
                await self.pod_files.sync(self.pod, self.facts())
            except (ConfigError, ApiError) as error:
                self.log.warning("cannot refresh volumes: %s", error)

    # Containers

    def _set(self, name: str, **changes: Any) -> None:
        self.runtimes[name] = replace(self.runtimes[name], **changes)
        self.changed.set()

    async def _command(self, container: Json) -> tuple[list[str], dict[str, str]]:
        settings = self.context.settings
        name = container["name"]
        program = program_for(container["image"], container.get("command") or ())
        assert program is not None  # unknown images never reach here
        injected = {"MODELPOOL_BIND_HOST": self.pod_ip, "HOSTNAME": self.name}
        if name in self.gpus:
            injected["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.gpus[name])
            injected["MODELPOOL_GPU_LOCK_DIR"] = str(settings.gpu_lock_dir)
        if self.pod_files.kubeconfig is not None:
            injected["KUBECONFIG"] = str(self.pod_files.kubeconfig)
        sources = await self.pod_files.sources(self.pod)
        env = container_env(container, self.facts(), sources, injected)
        mounts = self.pod_files.mounts.get(name, [])
        argv = container_argv(settings.python, program, container, env, mounts)
        # HOME is the pod's own directory, so `~/.kube/config` of the agent's user can
        # never stand in for a token the pod was not given.
        base = {**settings.base_env, "HOME": str(self.directory)}
        # What the agent injects names host paths already: never rewritten as mount paths
        # (a pod's /tmp volume must not capture a state directory that lives under /tmp).
        return argv, {**base, **rewrite_env(env, mounts), **injected}

    async def _run_init_containers(self) -> bool:
        """Run each init container to completion, in order, before any other container
        starts; a failed one is retried with backoff unless restartPolicy is Never, which
        fails the pod. False when the pod failed or is terminating."""
        policy = self.spec.get("restartPolicy", "Always")
        timing = self.context.settings.timing
        for container in self.spec.get("initContainers") or []:
            name = container["name"]
            for runtime_name in self.runtimes:
                self._set(runtime_name, reason="PodInitializing")
            while not self.terminate.is_set():
                try:
                    argv, env = await self._command(container)
                except (ConfigError, ApiError) as error:
                    self.log.warning("init container %s: %s", name, error)
                    self._set_init(name, state="waiting", reason="CreateContainerConfigError",
                                   message=str(error)[:300])
                    if await self._wait_terminate(timing.poll_seconds * 4):
                        return False
                    continue
                process = await processes.start(
                    argv, env, self.directory, self.directory / f"{name}.log"
                )
                self.live.add(process)
                started_at = rfc3339(time.time())
                self._set_init(name, state="running", reason="", started_at=started_at,
                               container_id=f"local://{process.pid}", started=True)
                code = await self._run_until_exit(container, process)
                self.live.discard(process)
                exit_code, reason, signal = processes.exit_reason(code)
                terminated = Terminated(
                    exit_code=exit_code, reason=reason, started_at=started_at,
                    finished_at=rfc3339(time.time()), container_id=f"local://{process.pid}",
                    signal=signal,
                )
                self.log.info("init container %s exited with %s", name, exit_code)
                if exit_code == 0:
                    self._set_init(name, state="terminated", terminated=terminated,
                                   started=False, container_id="")
                    break
                if self.terminate.is_set() or policy == "Never":
                    self._set_init(name, state="terminated", terminated=terminated,
                                   started=False, container_id="")
                    if policy == "Never":
                        self.failure = PodFailure(
                            reason="InitContainerFailed",
                            message=f"init container {name} exited with {exit_code}",
                        )
                    return False
                restart_count = self.init_runtimes[name].restart_count + 1
                delay = restarts.backoff_seconds(
                    restart_count, timing.backoff_base_seconds, timing.backoff_cap_seconds
                )
                self._set_init(name, state="waiting", reason="CrashLoopBackOff",
                               last_terminated=terminated, restart_count=restart_count,
                               started=False, container_id="")
                if await self._wait_terminate(delay):
                    return False
            if self.terminate.is_set():
                return False
        for runtime_name in self.runtimes:
            self._set(runtime_name, reason="ContainerCreating")
        return True

    def _set_init(self, name: str, **changes: Any) -> None:
        self.init_runtimes[name] = replace(self.init_runtimes[name], **changes)
        self.changed.set()

    async def _supervise(self, container: Json) -> None:
        name = container["name"]
        policy = self.spec.get("restartPolicy", "Always")
        timing = self.context.settings.timing
        log_file = self.directory / f"{name}.log"
        first = True
        while not self.terminate.is_set():
            try:
                argv, env = await self._command(container)
            except (ConfigError, ApiError) as error:
                self.log.warning("container %s: %s", name, error)
                self._set(name, state="waiting", reason="CreateContainerConfigError",
                          message=str(error)[:300])
                if await self._wait_terminate(timing.poll_seconds * 4):
                    break
                continue
            restart_count = self.runtimes[name].restart_count + (0 if first else 1)
            first = False
            process = await processes.start(argv, env, self.directory, log_file)
            self.live.add(process)
            started_at = rfc3339(time.time())
            container_id = f"local://{process.pid}"
            self.log.info("container %s started (pid %s): %s", name, process.pid, argv)
            self._event("Normal", "Started", f"Started container {name}")
            self._set(
                name,
                state="running",
                reason="",
                message="",
                started_at=started_at,
                container_id=container_id,
                restart_count=restart_count,
                ready="readinessProbe" not in container and "startupProbe" not in container,
                started="startupProbe" not in container,
            )
            code = await self._run_until_exit(container, process)
            self.live.discard(process)
            exit_code, reason, signal = processes.exit_reason(code)
            message = ""
            if exit_code and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                message = processes.log_tail(log_file)
            terminated = Terminated(
                exit_code=exit_code,
                reason=reason,
                started_at=started_at,
                finished_at=rfc3339(time.time()),
                container_id=container_id,
                message=message,
                signal=signal,
            )
            self.log.info("container %s exited with %s", name, exit_code)
            if self.terminate.is_set() or not restarts.should_restart(policy, exit_code):
                self._set(name, state="terminated", terminated=terminated, ready=False,
                          started=False, container_id="")
                break
            delay = restarts.backoff_seconds(
                restart_count + 1, timing.backoff_base_seconds, timing.backoff_cap_seconds
            )
            self._event("Warning", "BackOff", f"Back-off restarting failed container {name}")
            self._set(
                name,
                state="waiting",
                reason="CrashLoopBackOff",
                message=f"back-off {delay:g}s restarting failed container={name}",
                last_terminated=terminated,
                ready=False,
                started=False,
                container_id="",
            )
            if await self._wait_terminate(delay):
                break

    async def _run_until_exit(self, container: Json, process: processes.Process) -> int:
        """Wait for the process to exit, probing it meanwhile; a failed liveness or
        startup probe or a termination request stops it with the grace period."""
        name = container["name"]
        started = asyncio.Event()
        if "startupProbe" not in container:
            started.set()

        async def stop(why: str) -> None:
            self.log.info("container %s: %s; stopping it", name, why)
            self._event("Normal", "Killing", f"Stopping container {name}: {why}")
            await process.stop(self.grace_seconds())

        def on_startup(state: ProbeState) -> bool:
            if state.result is True:
                self._set(name, started=True,
                          ready="readinessProbe" not in container)
                started.set()
                return False
            return state.result is False

        def on_readiness(state: ProbeState) -> bool:
            ready = state.result is True
            if self.runtimes[name].ready != ready:
                self._set(name, ready=ready)
            return False

        def on_liveness(state: ProbeState) -> bool:
            return state.result is False

        async def terminate_watch() -> None:
            await self.terminate.wait()
            await stop("pod terminating")

        tasks = [asyncio.create_task(terminate_watch())]
        loops: list[tuple[str, Callable[[ProbeState], bool], bool]] = [
            ("startupProbe", on_startup, False),
            ("readinessProbe", on_readiness, True),
            ("livenessProbe", on_liveness, True),
        ]
        for key, handler, after_startup in loops:
            if key in container:
                spec = probe_spec(container[key], container, self.pod_ip)
                tasks.append(
                    asyncio.create_task(
                        self._probe_loop(key, spec, handler, started if after_startup else None,
                                         stop)
                    )
                )
        try:
            return await process.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _probe_loop(
        self,
        key: str,
        spec: ProbeSpec,
        handler: Callable[[ProbeState], bool],
        after: asyncio.Event | None,
        stop: Callable[[str], Any],
    ) -> None:
        """Probe every period; stop the container when the handler says the probe has
        failed for good (liveness, startup)."""
        if after is not None:
            await after.wait()
        await asyncio.sleep(spec.initial_delay)
        state = ProbeState()
        while True:
            ok = await probe_once(self.context.session, spec)
            state = step(spec, state, ok)
            if handler(state):
                self._event("Warning", "Unhealthy", f"{key} failed {state.failures} times")
                await stop(f"{key} failed {state.failures} times")
                return
            if key == "startupProbe" and state.result is True:
                return
            await asyncio.sleep(spec.period)

    # Events

    def _event(self, kind: str, reason: str, message: str) -> None:
        """Post an Event about the pod in the background; the same reason and message
        twice in a row are posted once (a retry loop must not flood the API server)."""
        if self.last_event == (reason, message):
            return
        self.last_event = (reason, message)
        body = event_body(self.pod, self.context.settings.node_name, kind, reason, message,
                          time.time())
        task = asyncio.create_task(self._post_event(body))
        self.event_tasks.add(task)
        task.add_done_callback(self.event_tasks.discard)

    async def _post_event(self, body: Json) -> None:
        try:
            await self.context.kube.create_event(self.namespace, body)
        except ApiError as error:
            self.log.warning("could not post event %s: %s", body["reason"], error)

    # Status

    async def _status_writer(self) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            try:
                await self._write_status()
            except ApiError as error:
                self.log.warning("status write failed: %s", error)
                await asyncio.sleep(self.context.settings.timing.poll_seconds)
                self.changed.set()

    async def _write_status(self) -> None:
        """Send the pod's status when it differs from what was last sent."""
        basis: Mapping[str, Any] = self.pod
        if self.last_written is not None:
            basis = {**self.pod, "status": self.last_written}
        body = pod_status(
            basis,
            [self.runtimes[c["name"]] for c in self.spec["containers"]],
            self.pod_ip,
            self.context.settings.host_ip,
            self.start_time,
            rfc3339(time.time()),
            self.failure,
            [self.init_runtimes[c["name"]] for c in self.spec.get("initContainers") or []],
        )
        if body == self.last_written:
            return
        await self.context.kube.patch_pod_status(self.namespace, self.name, body)
        self.last_written = body
