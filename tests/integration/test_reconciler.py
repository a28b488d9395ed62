"""The reconciler against the real API server of the local cluster.

The reconciler runs in-process, scoped to the test's namespace, with a fresh metrics
registry; the node agent runs every member as the fake model server. Nothing of
Kubernetes is faked: requests are written into a pool's status by compare-and-swap, as a
router would, and every assertion reads the API server (or the reconciler's /metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kr8s.asyncio
import pytest
from prometheus_client import CollectorRegistry

from e2e.harness import wait_established
from kubecore.pool_request import next_request_ops as request_cas_ops
from reconciler.__main__ import run
from reconciler.kube import (
    MODEL_POOLS,
    MODEL_ROUTERS,
    MODEL_SERVERS,
    PODS,
    Conflict,
    Kube,
)
from reconciler.settings import Settings, SwapSettings
from reconciler.writes import CREATE_RETRIED

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
Json = dict[str, Any]
T = TypeVar("T")
GROUP = "modelpool.dev/v1alpha1"
FAKE_MODEL = "modelpool/fake-model:test"


async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str, within: float = 60.0
) -> T:
    """Poll `check` until it returns something other than None."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = await check()
        if result is not None:
            return result
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {within}s waiting for {what}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Running:
    kube: Kube
    namespace: str
    registry: CollectorRegistry
    metrics_url: str
    task: asyncio.Task[None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, {"namespace": self.namespace, **labels})
        return value or 0.0

    async def get(self, plural: str, name: str) -> Json:
        resource = {"modelpools": MODEL_POOLS, "modelrouters": MODEL_ROUTERS,
                    "modelservers": MODEL_SERVERS}.get(plural)
        if resource is not None:
            return await self.kube.request("GET", resource, self.namespace, name)
        raise KeyError(plural)

    async def pool(self, name: str = "slot") -> Json:
        if self.task.done():  # the reconciler died: say why now, not at a timeout
            self.task.result()
            raise AssertionError("the reconciler stopped")
        return await self.kube.request("GET", MODEL_POOLS, self.namespace, name)

    async def request(self, member: str | None, pool: str = "slot") -> int:
        """Write status.request by compare-and-swap, as a router does; the new generation."""
        for _ in range(10):
            body = await self.pool(pool)
            ops = request_cas_ops(
                body.get("status"),
                body["metadata"]["resourceVersion"],
                {"member": member, "requestedAt": "2026-11-30T10:00:00Z",
                 "requestedBy": f"{self.namespace}/test/test"},
            )
            try:
                result = await self.kube.json_patch_status(MODEL_POOLS, self.namespace, pool, ops)
            except Conflict:  # the reconciler wrote the status meanwhile: read it again
                await asyncio.sleep(0.1)
                continue
            return int(result["status"]["request"]["generation"])
        raise AssertionError("could not write the request")


@pytest.fixture
def crds(cluster: Any, kubectl: Any) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests" / "crds"))
    wait_established(kubectl, [f"{plural}.modelpool.dev"
                               for plural in ("modelservers", "modelpools", "modelrouters")])


@pytest.fixture
async def reconciler(
    crds: None, kubeconfig: Path, namespace: str, api: kr8s.asyncio.Api
) -> AsyncIterator[Running]:
    port = _free_port()
    settings = Settings(
        namespace=namespace,
        kubeconfig=str(kubeconfig),
        bind_host="127.0.0.1",
        metrics_port=port,
        workers=4,
        # a Deployment whose pods cannot be created is retried this often (10 s by default)
        create_retry_seconds=2.0,
        # a pool's members may come up to 5 s after it before it is stalled: room for a
        # loaded machine in the test of a pool applied before its members
        swap=SwapSettings(probe_interval_seconds=0.5, probe_timeout_seconds=2.0,
                          standalone_settle_seconds=5.0),
    )
    registry = CollectorRegistry()
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, registry, stop, handle_signals=False))
    running = Running(Kube(api), namespace, registry, f"http://127.0.0.1:{port}/metrics",
                      task, stop)
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # raises whatever took the reconciler down


def server(name: str, *, load_time: float = 0.5, fail_load: bool = False,
           runtime: str = "llamacpp", idle: Json | None = None, gpu: int = 0,
           unload_time: float = 0.0) -> Json:
    """A member run by the fake model server. No GPU by default: the testbed's node has
    one, shared by every test namespace (and by whoever else uses a reused cluster), so a
    GPU request would make these tests wait on others. Without the scheduler's help the
    reconciler alone must keep two members from running at once, which the tests sample.
    """
    env = [{"name": "FAKE_MODEL_LOAD_TIME", "value": str(load_time)},
           {"name": "FAKE_MODEL_TOKENS_PER_SECOND", "value": "10"}]
    if fail_load:
        env.append({"name": "FAKE_MODEL_FAIL_LOAD", "value": "1"})
    if unload_time:
        env.append({"name": "FAKE_MODEL_UNLOAD_TIME", "value": str(unload_time)})
    spec: Json = {
        "runtime": runtime,
        "image": FAKE_MODEL,
        "model": f"/models/{name}.gguf",
        "env": env,
        "resources": {"gpu": gpu},
    }
    if runtime == "llamacpp":
        spec["args"] = ["--mode", "llamacpp"]
    elif runtime == "generic":
        spec["args"] = ["--mode", "llamacpp", "--model", name]
    if idle is not None:
        spec["idle"] = idle
    return {"apiVersion": GROUP, "kind": "ModelServer", "metadata": {"name": name},
            "spec": spec}


def pool(members: list[str], default: str | None = "a", budget: str = "60s",
         name: str = "slot") -> Json:
    spec: Json = {"members": [{"name": m} for m in members], "swapBudget": budget}
    if default is not None:
        spec["default"] = default
    return {"apiVersion": GROUP, "kind": "ModelPool", "metadata": {"name": name}, "spec": spec}


def router(backends: list[str], name: str = "chat") -> Json:
    return {
        "apiVersion": GROUP,
        "kind": "ModelRouter",
        "metadata": {"name": name},
        "spec": {
            "backends": [{"name": b, "modelServerRef": {"name": b}} for b in backends],
            "defaultRoute": backends[0],
            "proxy": {"image": "modelpool/router:test"},
        },
    }


async def event_seen(kubectl: Any, namespace: str, about: str, text: str) -> None:
    """Wait for an Event on object `about` whose reason or message holds `text` (Events
    are posted after the status write that a test usually waits for)."""

    async def check() -> bool | None:
        events = kubectl.json("get", "events", "-n", namespace,
                              "--field-selector", f"involvedObject.name={about}")["items"]
        found = any(text == e.get("reason") or text in e.get("message", "") for e in events)
        return True if found else None

    await eventually(check, f"an Event {text} about {about}", 20)


def apply(kubectl: Any, namespace: str, *objects: Json) -> None:
    """As git would: one client-side apply of them all (field manager kubectl), in order."""
    listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(listed))


def replicas(kubectl: Any, namespace: str, name: str) -> int | None:
    deployment = kubectl.json_or_none("get", "deployment", name, "-n", namespace)
    if deployment is None:
        return None
    return int(deployment["spec"].get("replicas", 1))


def condition(obj: Json, type_: str) -> Json | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


async def ready_with(running: Running, member: str) -> Json:
    return await ready_with_pool(running, "slot", member)


async def ready_with_pool(running: Running, pool_name: str, member: str) -> Json:
    async def check() -> Json | None:
        body = await running.pool(pool_name)
        status = body.get("status") or {}
        if status.get("phase") == "Ready" and status.get("residentMember") == member:
            return body
        return None

    return await eventually(check, f"pool Ready with {member} resident", within=90)


async def condition_when(running: Running, plural: str, name: str, type_: str,
                         holds: Callable[[Json], bool], what: str, within: float = 60.0
                         ) -> Json:
    """An object's condition `type_` once `holds` is true of it."""
    async def check() -> Json | None:
        c = condition(await running.get(plural, name), type_)
        return c if c is not None and holds(c) else None

    return await eventually(check, what, within)


async def ready_reason(running: Running, reason: str, what: str) -> tuple[Json, Json | None]:
    """The pool's Ready condition once its reason is `reason`, and its Reconciling condition
    of the same read (one status write: a later read may already show the next state)."""
    async def check() -> tuple[Json, Json | None] | None:
        body = await running.get("modelpools", "slot")
        ready = condition(body, "Ready")
        if ready is None or ready["reason"] != reason:
            return None
        return ready, condition(body, "Reconciling")

    return await eventually(check, what)


def _active_member(pod: Json) -> str | None:
    """The member a pod belongs to while it may hold the GPU: placed on a node and not
    finished (terminating included). A pod behind its slot gate holds nothing."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    return ((pod.get("metadata") or {}).get("labels") or {}).get("modelpool.dev/model-server")


@contextlib.asynccontextmanager
async def sampling(kube: Kube, namespace: str) -> AsyncIterator[list[set[str]]]:
    """Which members have pods placed on a node, after every pod event while the block
    runs: a watch, not a poll, so an overlap however short is seen. The first sample is
    the listed state."""
    samples: list[set[str]] = []
    listed = asyncio.Event()

    async def loop() -> None:
        pods, version = await kube.list_all(PODS, namespace, "modelpool.dev/model-server")
        members = {p["metadata"]["name"]: _active_member(p) for p in pods}
        samples.append({m for m in members.values() if m})
        listed.set()
        while True:
            async for type_, pod in kube.watch(PODS, namespace, version,
                                               "modelpool.dev/model-server"):
                version = pod["metadata"].get("resourceVersion", version)
                if type_ == "BOOKMARK":
                    continue
                name = pod["metadata"]["name"]
                members[name] = None if type_ == "DELETED" else _active_member(pod)
                samples.append({m for m in members.values() if m})

    task = asyncio.create_task(loop())
    try:
        await asyncio.wait_for(listed.wait(), 30)
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # the sampler's own failure is the test's failure, not a quiet empty list
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise AssertionError("the pod watch failed") from task.exception()


async def test_a_cold_pool_loads_its_default_then_a_request_swaps_without_overlap(
    reconciler: Running, kubectl: Any, namespace: str, api: kr8s.asyncio.Api
) -> None:
    # sampled from the install on: servers applied before the pool that lists them must
    # not start on their own in the moment before the pool reaches the reconciler
    async with sampling(reconciler.kube, namespace) as installing:
        apply(kubectl, namespace, server("a"), server("b", load_time=2), pool(["a", "b"]),
              router(["a", "b"]))
        body = await ready_with(reconciler, "a")
    assert all(len(s) <= 1 for s in installing), [s for s in installing if len(s) > 1]
    ready = condition(body, "Ready")
    assert ready is not None and ready["status"] == "True"
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    assert replicas(kubectl, namespace, "a") == 1
    assert replicas(kubectl, namespace, "b") == 0

    # the router's objects exist and are owned by it
    chat = kubectl.json("get", "modelrouter", "chat", "-n", namespace)
    for kind, name in [("deployment", "chat-router"), ("serviceaccount", "chat-router"),
                       ("role", "chat-router"), ("rolebinding", "chat-router"),
                       ("service", "chat-router"), ("configmap", "chat-config")]:
        obj = kubectl.json("get", kind, name, "-n", namespace)
        owners = obj["metadata"].get("ownerReferences") or []
        assert [o["uid"] for o in owners] == [chat["metadata"]["uid"]], (kind, name)

    async with sampling(reconciler.kube, namespace) as samples:
        generation = await reconciler.request("b")
        body = await ready_with(reconciler, "b")
    assert samples, "nothing was sampled"
    assert all(len(s) <= 1 for s in samples), [s for s in samples if len(s) > 1]
    assert {"a"} in samples and {"b"} in samples
    last = body["status"]["lastSwap"]
    assert (last["from"], last["to"], last["generation"], last["outcome"]) == (
        "a", "b", generation, "Succeeded")
    assert last["durationSeconds"] > 0
    assert replicas(kubectl, namespace, "a") == 0

    assert reconciler.sample("modelpool_swaps_total", pool="slot", **{"from": "a", "to": "b"}) == 1
    assert reconciler.sample("modelpool_resident", pool="slot", member="b") == 1
    assert reconciler.sample("modelpool_resident", pool="slot", member="a") == 0
    for phase in ("drain", "unload", "schedule", "load"):
        assert reconciler.sample("modelpool_swap_phase_duration_seconds_count", pool="slot",
                                 phase=phase) >= 1, phase
    async with aiohttp.ClientSession() as session, session.get(reconciler.metrics_url) as r:
        text = await r.text()
    for family in ("resident", "swaps_total", "swap_duration_seconds",
                   "swap_phase_duration_seconds", "swap_failures_total",
                   "swap_deferrals_total", "reconcile_total", "reconcile_duration_seconds"):
        assert f"# TYPE modelpool_{family} " in text, family

    await event_seen(kubectl, namespace, "slot", "SwapCompleted")

    # no controller wrote any spec: the reconciler's managed fields are status only
    status_writers = set()
    for kind in ("modelserver", "modelpool", "modelrouter"):
        for obj in kubectl.json("get", kind, "-n", namespace, "--show-managed-fields")["items"]:
            for entry in obj["metadata"]["managedFields"]:
                if entry["manager"] == "modelpool-reconciler":
                    assert entry.get("subresource") == "status", (kind, entry)
                    assert "f:spec" not in json.dumps(entry.get("fieldsV1")), (kind, entry)
                    status_writers.add(kind)
                elif entry.get("subresource") != "status":
                    assert entry["manager"].startswith("kubectl"), (kind, entry)
    assert status_writers == {"modelserver", "modelpool", "modelrouter"}


async def test_a_busy_incumbent_defers_the_swap_until_its_request_ends(
    reconciler: Running, kubectl: Any, namespace: str, api: kr8s.asyncio.Api
) -> None:
    apply(kubectl, namespace, server("a"), server("b"), pool(["a", "b"]))
    await ready_with(reconciler, "a")
    pods, _ = await reconciler.kube.list_all(PODS, namespace, "modelpool.dev/model-server=a")
    ip = pods[0]["status"]["podIP"]
    streamed: list[bytes] = []

    async def stream() -> None:  # 40 tokens at 10 per second: about 4 s busy
        async with aiohttp.ClientSession() as session, session.post(
            f"http://{ip}:8080/v1/chat/completions",
            json={"model": "a", "stream": True, "max_tokens": 40,
                  "messages": [{"role": "user", "content": "hi"}]},
        ) as response:
            assert response.status == 200
            async for chunk in response.content.iter_any():
                streamed.append(chunk)

    streaming = asyncio.create_task(stream())
    await eventually(lambda: asyncio.sleep(0, streamed or None), "the stream to start", 20)
    await reconciler.request("b")

    async def deferred() -> Json | None:
        c = condition(await reconciler.pool(), "SwapDeferred")
        return c if c and c["status"] == "True" and c["reason"] == "PodsBusy" else None

    await eventually(deferred, "SwapDeferred PodsBusy", 20)
    assert not streaming.done(), "the stream ended before the deferral was seen"
    assert replicas(kubectl, namespace, "a") == 1
    assert reconciler.sample("modelpool_swap_deferrals_total", pool="slot",
                             reason="PodsBusy") >= 1
    await asyncio.wait_for(streaming, 30)
    await ready_with(reconciler, "b")


async def test_a_target_that_never_turns_ready_is_abandoned_and_the_next_request_swaps(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    # a generous budget except around the doomed swap: a loaded machine starts pods slowly
    apply(kubectl, namespace, server("a"), server("b", fail_load=True), server("c"),
          pool(["a", "b", "c"]))
    await ready_with(reconciler, "a")
    apply(kubectl, namespace, pool(["a", "b", "c"], budget="8s"))
    await eventually(lambda: _observed(reconciler), "the new budget observed", 20)
    generation = await reconciler.request("b")

    async def abandoned() -> Json | None:
        status = (await reconciler.pool()).get("status") or {}
        last = status.get("lastSwap") or {}
        request = status.get("request") or {}
        if last.get("outcome") == "Abandoned" and request.get("generation") != generation:
            return status
        return None

    status = await eventually(abandoned, "the swap to be abandoned", 40)
    last = status["lastSwap"]
    assert (last["to"], last["generation"], last["reason"]) == ("b", generation,
                                                                "SwapBudgetExceeded")
    assert 8 <= last["durationSeconds"] < 15
    assert status["request"]["generation"] == generation + 1
    assert status["request"].get("member") is None
    assert replicas(kubectl, namespace, "b") == 0
    assert reconciler.sample("modelpool_swap_failures_total", pool="slot", member="b",
                             reason="SwapBudgetExceeded") == 1
    # the pool is cold again and loads its default; the next request swaps normally
    apply(kubectl, namespace, pool(["a", "b", "c"]))
    await ready_with(reconciler, "a")
    await reconciler.request("c")
    body = await ready_with(reconciler, "c")
    assert body["status"]["lastSwap"]["outcome"] == "Succeeded"


async def test_a_missing_member_stalls_until_the_spec_is_fixed(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    apply(kubectl, namespace, server("a"), pool(["a", "ghost"]))

    async def stalled() -> Json | None:
        c = condition(await reconciler.pool(), "Stalled")
        return c if c and c["status"] == "True" else None

    c = await eventually(stalled, "Stalled", 30)
    assert c["reason"] == "MemberNotFound" and "ghost" in c["message"]
    await event_seen(kubectl, namespace, "slot", "MemberNotFound")
    assert replicas(kubectl, namespace, "a") in (None, 0)  # nothing scaled

    apply(kubectl, namespace, server("ghost"))
    body = await ready_with(reconciler, "a")
    c2 = condition(body, "Stalled")
    assert c2 is not None and c2["status"] == "False"


async def test_a_budgeted_pool_with_a_member_lacking_a_footprint_stalls_until_fixed(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    budgeted = pool(["a", "b"])
    budgeted["spec"]["gpuMemory"] = "16Gi"
    budgeted["spec"]["members"][0]["gpuMemory"] = "8Gi"
    apply(kubectl, namespace, server("a"), server("b"), budgeted)

    async def stalled() -> Json | None:
        c = condition(await reconciler.pool(), "Stalled")
        return c if c and c["status"] == "True" else None

    c = await eventually(stalled, "Stalled", 30)
    assert c["reason"] == "MemberFootprintMissing" and "for b:" in c["message"], c
    await event_seen(kubectl, namespace, "slot", "MemberFootprintMissing")
    for name in ("a", "b"):
        assert replicas(kubectl, namespace, name) in (None, 0), name  # nothing scaled

    # b's ModelServer states its footprint: a valid budgeted pool acts as an exclusive one
    fixed = server("b")
    fixed["spec"]["resources"]["gpuMemory"] = "4Gi"
    apply(kubectl, namespace, fixed)
    body = await ready_with(reconciler, "a")
    c2 = condition(body, "Stalled")
    assert c2 is not None and c2["status"] == "False"


GIB = 1 << 30


async def residents_are(running: Running, members: set[str], within: float = 90) -> Json:
    async def check() -> Json | None:
        body = await running.pool()
        status = body.get("status") or {}
        names = {r["name"] for r in status.get("residents") or []}
        return body if status.get("phase") == "Ready" and names == members else None

    return await eventually(check, f"pool Ready with {sorted(members)} resident", within)


async def test_a_budgeted_pool_holds_what_fits_and_evicts_the_least_recently_used(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """16 GiB; a 8 GiB, b 6 GiB, c 10 GiB. a and b fit together: a request for b loads it
    beside a, nobody drained. c does not fit beside both: the least recently used (a) is
    evicted for it, and the footprints placed never pass the budget."""
    sizes = {"a": 8 * GIB, "b": 6 * GIB, "c": 10 * GIB}
    budgeted = pool(["a", "b", "c"])
    budgeted["spec"]["gpuMemory"] = "16Gi"
    for entry in budgeted["spec"]["members"]:
        entry["gpuMemory"] = str(sizes[entry["name"]])
    async with sampling(reconciler.kube, namespace) as samples:
        apply(kubectl, namespace, server("a"), server("b"), server("c"), budgeted)
        await residents_are(reconciler, {"a"})
        await reconciler.request("b")
        body = await residents_are(reconciler, {"a", "b"})
        assert body["status"]["roomLeft"] == 2 * GIB
        assert replicas(kubectl, namespace, "a") == 1, "a fits beside b: never drained"
        assert reconciler.sample("modelpool_evictions_total", pool="slot", member="a",
                                 for_member="b") == 0
        generation = await reconciler.request("c")
        body = await residents_are(reconciler, {"b", "c"})
    assert all(sum(sizes[m] for m in placed) <= 16 * GIB for placed in samples), samples
    assert {"a", "b"} in samples, "a and b never ran together"
    status = body["status"]
    assert replicas(kubectl, namespace, "a") == 0
    last = status["lastSwap"]
    assert (last["to"], last["evicted"], last["generation"], last["outcome"]) == (
        "c", ["a"], generation, "Succeeded")
    assert [(r["name"], r["gpuMemory"]) for r in status["residents"]] == [
        ("b", 6 * GIB), ("c", 10 * GIB)]
    assert status["roomLeft"] == 0 and status["loads"] == []
    assert reconciler.sample("modelpool_evictions_total", pool="slot", member="a",
                             for_member="c") == 1
    for member, resident in (("a", 0), ("b", 1), ("c", 1)):
        assert reconciler.sample("modelpool_resident", pool="slot", member=member) == resident
    await event_seen(kubectl, namespace, "slot", "Evicted")
    # each member charges its footprint where its device keeps a ledger
    deployment = kubectl.json("get", "deployment", "c", "-n", namespace)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MODELPOOL_GPU_FOOTPRINT", "value": str(10 * GIB)} in env
    listed = kubectl("get", "mpool", "slot", "-n", namespace).stdout
    assert "b,c" in listed, listed


async def test_a_pool_applied_before_its_members_is_in_progress_never_degraded(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    # a GitOps sync may create the pool a moment before its members: until they come (or
    # a few seconds pass) the pool reads Cold and Reconciling, not Degraded and Stalled
    phases: list[tuple[str | None, str | None]] = []

    async def watch_phase() -> None:
        while True:
            with contextlib.suppress(Exception):
                body = await reconciler.pool()
                reconciling = condition(body, "Reconciling") or {}
                phases.append(((body.get("status") or {}).get("phase"),
                               reconciling.get("reason")))
            await asyncio.sleep(0.1)

    apply(kubectl, namespace, pool(["a", "b"]))
    task = asyncio.create_task(watch_phase())
    try:
        await eventually(
            lambda: _async(("Cold", "WaitingForMembers") in phases or None),
            "the pool waiting for its members", 20)
        apply(kubectl, namespace, server("a"), server("b"))
        await ready_with(reconciler, "a")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert all(phase != "Degraded" for phase, _ in phases), phases
    events = kubectl.json("get", "events", "-n", namespace,
                          "--field-selector", "involvedObject.name=slot")["items"]
    assert not [e for e in events if e.get("reason") == "MemberNotFound"]


async def _async(value: T) -> T:
    return value


async def test_a_hand_edited_replica_count_is_put_back(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    apply(kubectl, namespace, server("a"), server("b"), pool(["a", "b"]))
    await ready_with(reconciler, "a")
    kubectl("scale", "deployment", "b", "-n", namespace, "--replicas=1")

    async def put_back() -> bool | None:
        return True if replicas(kubectl, namespace, "b") == 0 else None

    await eventually(put_back, "b's replicas put back to 0", 20)
    assert replicas(kubectl, namespace, "a") == 1


async def test_an_idle_reconciler_makes_no_writes(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """How writes are counted, three ways at once: (1) for every object in the namespace,
    the managedFields entries of field manager modelpool-reconciler with their times (any
    write that changes a field the reconciler owns moves its entry); (2) the Events the
    reconciler posted; (3) the reconciler's own count of the writes it sent
    (modelpool_reconciler_api_writes_total). Other writers (the controller manager, the
    node agent) are left out on purpose: they are not the reconciler."""
    apply(kubectl, namespace, server("a"), server("b"), pool(["a", "b"]), router(["a", "b"]))
    await ready_with(reconciler, "a")

    kinds = "modelservers,modelpools,modelrouters,deployments,replicasets,services,configmaps," \
            "serviceaccounts,roles,rolebindings,endpointslices"

    def footprint() -> tuple[dict[str, str], int, dict[str, float]]:
        items = kubectl.json("get", kinds, "-n", namespace, "--show-managed-fields")["items"]
        entries = {
            f"{o['kind']}/{o['metadata']['name']}/{e.get('subresource', '')}":
                f"{e.get('time')}:{json.dumps(e.get('fieldsV1'), sort_keys=True)}"
            for o in items
            for e in o["metadata"].get("managedFields") or []
            if e["manager"] == "modelpool-reconciler"
        }
        events = kubectl.json("get", "events", "-n", namespace)["items"]
        ours = sum(1 for e in events if e.get("reportingComponent") == "modelpool-reconciler")
        sent = {
            f"{sample.labels['verb']} {sample.labels['resource']}": sample.value
            for metric in reconciler.registry.collect()
            if metric.name == "modelpool_reconciler_api_writes"
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
        return entries, ours, sent

    def queued() -> float:
        return reconciler.registry.get_sample_value("modelpool_reconciler_queue_depth") or 0.0

    # the swap's last status writes follow the member turning Ready: wait for a quiet spell,
    # nothing written for 3 s and nothing left in the reconciler's work queue
    quiet_since, before = time.monotonic(), footprint()
    started = time.monotonic()
    while time.monotonic() - quiet_since < 3 or queued():
        await asyncio.sleep(0.5)
        now = footprint()
        if now != before or queued():
            before, quiet_since = now, time.monotonic()
        assert time.monotonic() - started < 60, "the reconciler never went quiet"
    assert before[0], "no object shows the reconciler as a field manager"

    # Nothing runs on a timer, so idleness is shown by waking the reconciler on purpose:
    # annotations change no spec, yet every object it reads (and the Deployments it owns)
    # is reconciled again. Once each kind's reconcile count moved, nothing may be written.
    def reconciles(kind: str) -> float:
        value = reconciler.registry.get_sample_value(
            "modelpool_reconcile_total", {"kind": kind, "result": "success"})
        return value or 0.0

    counted = {kind: reconciles(kind) for kind in ("ModelServer", "ModelPool", "ModelRouter")}
    for target in ("modelserver/a", "modelserver/b", "modelpool/slot", "modelrouter/chat",
                   "deployment/a", "deployment/chat-router"):
        kubectl("annotate", "-n", namespace, "--overwrite", target, "test.modelpool.dev/poke=1")
    for kind, count in counted.items():
        async def moved(kind: str = kind, count: float = count) -> bool | None:
            return reconciles(kind) > count or None

        await eventually(moved, f"{kind} reconciled again", 20)
    after = footprint()
    written = {key: (before[2].get(key, 0.0), count) for key, count in after[2].items()
               if count != before[2].get(key, 0.0)}
    assert not written, ("the reconciler sent writes while idle (before, after)", written,
                       {key: (before[0].get(key), entry) for key, entry in after[0].items()
                        if entry != before[0].get(key)})
    assert after[1] == before[1], "the reconciler posted Events while idle"
    assert after[0] == before[0]


async def test_an_idle_probe_answering_an_error_status_fails_closed(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """The incumbent's idle endpoint answers 404 (a generic member whose idle metric lives
    on a path it does not serve): IdleCheckFailed, and the incumbent is not unloaded."""
    broken = server("a", runtime="generic", idle={"path": "/missing", "metric": "inflight"})
    apply(kubectl, namespace, broken, server("b"), pool(["a", "b"], budget="20s"))
    await ready_with(reconciler, "a")
    await reconciler.request("b")

    async def deferred() -> Json | None:
        c = condition(await reconciler.pool(), "SwapDeferred")
        return c if c and c["status"] == "True" and c["reason"] == "IdleCheckFailed" else None

    c = await eventually(deferred, "SwapDeferred IdleCheckFailed", 20)
    assert "404" in c["message"]
    # It stays so, probed again every 0.5 s and failing closed each time. What must not
    # happen has no event to wait for: a window of several probe intervals is the check.
    for _ in range(10):
        assert replicas(kubectl, namespace, "a") == 1
        assert replicas(kubectl, namespace, "b") == 0
        await asyncio.sleep(0.3)
    assert reconciler.sample("modelpool_swap_deferrals_total", pool="slot",
                             reason="IdleCheckFailed") == 1


async def test_a_member_that_can_never_be_probed_is_reported_as_such(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    apply(kubectl, namespace, server("a", runtime="generic"), server("b"), pool(["a", "b"]))
    await ready_with(reconciler, "a")
    generation = await reconciler.request("b")

    async def failed() -> Json | None:
        status = (await reconciler.pool()).get("status") or {}
        last = status.get("lastSwap") or {}
        request = status.get("request") or {}
        if last.get("outcome") == "Failed" and request.get("generation") != generation:
            return status
        return None

    status = await eventually(failed, "the swap to fail", 20)
    assert status["lastSwap"]["reason"] == "IdleProbeUnsupported"
    assert status["lastSwap"]["generation"] == generation
    assert status["request"].get("member") is None
    assert status["residentMember"] == "a"
    assert replicas(kubectl, namespace, "a") == 1
    await event_seen(kubectl, namespace, "slot", "IdleProbeUnsupported")


async def test_a_member_in_two_pools_stalls_both_until_fixed(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    # pools first: a ModelServer that no pool lists yet runs at its own spec.replicas
    apply(kubectl, namespace, pool(["a", "b"], name="one"),
          pool(["c", "b"], default="c", name="two"),
          server("a"), server("b"), server("c"))

    async def both_stalled() -> bool | None:
        for name in ("one", "two"):
            c = condition(await reconciler.pool(name), "Stalled")
            if not (c and c["status"] == "True" and c["reason"] == "MemberInTwoPools"):
                return None
        return True

    await eventually(both_stalled, "both pools Stalled", 30)
    for name in ("a", "b", "c"):
        assert replicas(kubectl, namespace, name) in (None, 0), name  # nothing scaled
    for name in ("one", "two"):
        await event_seen(kubectl, namespace, name, "MemberInTwoPools")

    apply(kubectl, namespace, pool(["c"], default="c", name="two"))
    await eventually(
        lambda: _resident(reconciler, "one", "a"), "pool one Ready with a", 60)
    await eventually(
        lambda: _resident(reconciler, "two", "c"), "pool two Ready with c", 60)


async def _observed(running: Running, pool_name: str = "slot") -> bool | None:
    body = await running.pool(pool_name)
    seen = (body.get("status") or {}).get("observedGeneration")
    return True if seen == body["metadata"]["generation"] else None


async def _resident(running: Running, pool_name: str, member: str) -> bool | None:
    status = (await running.pool(pool_name)).get("status") or {}
    return True if status.get("residentMember") == member and status.get("phase") == "Ready" \
        else None


async def test_a_router_that_refers_to_no_server_keeps_only_its_config_and_owns_what_it_renders(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    apply(kubectl, namespace, server("a"), router(["a"]))

    async def rendered() -> bool | None:
        for kind, name in (("role", "chat-router"), ("configmap", "chat-config"),
                           ("deployment", "chat-router")):
            if kubectl.json_or_none("get", kind, name, "-n", namespace) is None:
                return None
        return True

    await eventually(rendered, "the router's Role", 30)
    # a hand edit of a rendered ConfigMap is put back
    original = kubectl.json("get", "configmap", "chat-config", "-n", namespace)["data"]
    kubectl("patch", "configmap", "chat-config", "-n", namespace, "--type=merge",
            "-p", json.dumps({"data": {"config.json": "{}"}}))

    async def restored() -> bool | None:
        data = kubectl.json("get", "configmap", "chat-config", "-n", namespace)["data"]
        return True if data == original else None

    await eventually(restored, "the router's config put back", 30)
    external = router(["a"])
    external["spec"]["backends"] = [{"name": "ext", "url": "http://127.0.0.1:9"}]
    external["spec"]["defaultRoute"] = "ext"
    apply(kubectl, namespace, external)

    async def pruned() -> bool | None:
        rules = kubectl.json("get", "role", "chat-router", "-n", namespace)["rules"]
        # the router still reads its own ConfigMap, and nothing else
        return True if [r["resources"] for r in rules] == [["configmaps"]] else None

    await eventually(pruned, "the router's Role cut to its ConfigMap", 30)
    assert kubectl("get", "deployment", "chat-router", "-n", namespace,
                   check=False).returncode == 0
    # deleting the router removes all it owned (garbage collection follows the owners)
    kubectl("delete", "modelrouter", "chat", "-n", namespace)

    async def collected() -> bool | None:
        for kind, name in (("deployment", "chat-router"), ("service", "chat-router"),
                           ("configmap", "chat-config"), ("role", "chat-router"),
                           ("rolebinding", "chat-router"), ("serviceaccount", "chat-router")):
            if kubectl.json_or_none("get", kind, name, "-n", namespace) is not None:
                return None
        return True

    await eventually(collected, "the router's objects collected", 60)


async def test_a_router_in_a_namespace_being_deleted_is_left_to_go_with_it(
    reconciler: Running, kubectl: Any, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The namespace controller deletes what the router rendered, and the server it refers
    to, while the ModelRouter (held here by a finalizer) is still there. Whichever the
    reconciler meets first (a render refused with 403 NamespaceTerminating, a server gone
    whose Warning is refused the same way, or the router marked for deletion), it stops:
    no stall, no Event, no retry, a line in the log."""
    held = router(["a"])
    held["metadata"]["finalizers"] = ["modelpool.dev/test-hold"]
    apply(kubectl, namespace, server("a"), held)

    async def rendered() -> bool | None:
        found = kubectl.json_or_none("get", "configmap", "chat-config", "-n", namespace)
        return True if found is not None else None

    await eventually(rendered, "the router's ConfigMap", 30)
    caplog.set_level(logging.INFO, logger="reconciler")
    kubectl("delete", "namespace", namespace, "--wait=false")
    try:
        def stopped() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if f"ModelRouter {namespace}/chat" in r.getMessage()
                    and ("its namespace is being deleted" in r.getMessage()
                         or "is being deleted: what it rendered goes with it" in r.getMessage())]

        async def refused() -> bool | None:
            return True if stopped() else None

        await eventually(refused, "the router's reconcile stopped by the namespace", 60)
        body = await reconciler.get("modelrouters", "chat")
        assert (condition(body, "Stalled") or {}).get("status") != "True", body["status"]
        retried = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith(f"reconcile of ModelRouter {namespace}/chat")
                   and "again in" in r.getMessage()]
        assert retried == []
        assert not [r for r in caplog.records if "ApplyRefused" in r.getMessage()]
    finally:
        kubectl("patch", "modelrouter", "chat", "-n", namespace, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False)


async def test_a_member_added_with_the_pools_change_is_waited_for_not_stalled(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    # a commit that adds a member to a pool and the member itself: the pool's change may
    # reach the reconciler first; it reads Reconciling meanwhile, never Stalled (Flux fails
    # a sync at once on a Stalled object)
    apply(kubectl, namespace, server("a"), server("b"), pool(["a", "b"]))
    await ready_with(reconciler, "a")
    seen: list[tuple[str, str | None]] = []

    async def watch() -> None:
        while True:
            with contextlib.suppress(Exception):
                body = await reconciler.pool()
                for type_ in ("Reconciling", "Stalled"):
                    c = condition(body, type_) or {}
                    if c.get("status") == "True":
                        seen.append((type_, c.get("reason")))
            await asyncio.sleep(0.05)

    task = asyncio.create_task(watch())
    try:
        apply(kubectl, namespace, pool(["a", "b", "c"]))  # the pool's change first
        await eventually(
            lambda: _async(("Reconciling", "WaitingForMembers") in seen or None),
            "the changed pool waiting for its new member", 20)
        apply(kubectl, namespace, server("c"))

        async def has_c() -> bool | None:
            body = await reconciler.pool()
            members = (body.get("status") or {}).get("members") or []
            stalled = (condition(body, "Stalled") or {}).get("status")
            return (any(m.get("name") == "c" for m in members) and stalled == "False") or None

        await eventually(has_c, "the pool reporting its new member", 20)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert all(type_ != "Stalled" for type_, _ in seen), seen


async def test_a_router_applied_before_its_server_is_in_progress_never_stalled(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    # Flux fails a sync at once on a Stalled object: a router applied a moment before the
    # ModelServer it names reads Reconciling (WaitingForModelServer), not Stalled
    seen: list[tuple[str | None, str | None]] = []

    async def watch() -> None:
        while True:
            with contextlib.suppress(Exception):
                body = await reconciler.get("modelrouters", "chat")
                for type_ in ("Reconciling", "Stalled"):
                    c = condition(body, type_) or {}
                    if c.get("status") == "True":
                        seen.append((type_, c.get("reason")))
            await asyncio.sleep(0.1)

    apply(kubectl, namespace, router(["a"]))
    task = asyncio.create_task(watch())
    try:
        await eventually(
            lambda: _async(("Reconciling", "WaitingForModelServer") in seen or None),
            "the router waiting for its ModelServer", 20)
        apply(kubectl, namespace, server("a"))

        async def rendered() -> bool | None:
            return kubectl.json_or_none("get", "deployment", "chat-router", "-n",
                                        namespace) is not None or None

        await eventually(rendered, "the router rendered once its server exists", 30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert all(type_ != "Stalled" for type_, _ in seen), seen
    events = kubectl.json("get", "events", "-n", namespace,
                          "--field-selector", "involvedObject.name=chat")["items"]
    assert not [e for e in events if e.get("reason") == "CannotRender"]


async def test_reclaim_hands_the_slot_back_to_the_default_once_idle(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    reclaiming = pool(["a", "b"])
    reclaiming["spec"].update(swapPolicy="reclaim", reclaimAfter="3s")
    apply(kubectl, namespace, server("a"), server("b"), reclaiming)
    await ready_with(reconciler, "a")
    await reconciler.request("b")
    await ready_with(reconciler, "b")
    body = await ready_with(reconciler, "a")
    last = body["status"]["lastSwap"]
    assert (last["from"], last["to"], last["outcome"]) == ("b", "a", "Succeeded")
    assert reconciler.sample("modelpool_swaps_total", pool="slot", **{"from": "b", "to": "a"}) == 1


async def test_a_member_the_scheduler_will_not_place_is_reported_with_who_holds_the_gpu(
    reconciler: Running, kubectl: Any, namespace: str, api: kr8s.asyncio.Api
) -> None:
    """The node's one GPU is held by another pool's member: the second pool says why it
    cannot load (condition and Event, naming the holder) instead of waiting silently,
    and loads as soon as the GPU is free."""
    apply(kubectl, namespace, server("hog", gpu=1), pool(["hog"], default="hog", name="other"))
    await ready_with_pool(reconciler, "other", "hog")
    (holder,) = [p["metadata"]["name"] for p in kubectl.json(
        "get", "pods", "-n", namespace, "-l", "modelpool.dev/model-server=hog")["items"]]

    apply(kubectl, namespace, server("a", gpu=1), pool(["a"], default="a", budget="300s"))

    ready, reconciling = await ready_reason(reconciler, "Unschedulable",
                                            "the pool to say its member is unschedulable")
    assert ready["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in ready["message"], ready
    assert f"nvidia.com/gpu is held by {namespace}/{holder} on " in ready["message"], ready
    assert reconciling is not None and reconciling["status"] == "True"
    assert reconciling["reason"] == "Unschedulable"
    await event_seen(kubectl, namespace, "slot", f"held by {namespace}/{holder}")

    kubectl("delete", "modelpool", "other", "-n", namespace)
    kubectl("delete", "modelserver", "hog", "-n", namespace)
    body = await ready_with(reconciler, "a")
    resident = condition(body, "Ready")
    assert resident is not None and resident["reason"] == "Resident"


# Without the reconciler's retries the test takes 175 s: 82 to 15 refusals, 84 to the load.
@pytest.mark.timeout(300)
async def test_a_member_whose_pods_cannot_be_created_is_reported_with_the_reason(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """A member whose weights are a hostPath, in a namespace that enforces the
    `restricted` Pod Security level: its ReplicaSet cannot create its pod, so there is no
    pod to say why. The pool says it (condition and Event, in the API server's words)
    instead of waiting silently, and loads once the namespace allows the pod: within the
    reconciler's retry period, though the ReplicaSet controller's own next try is by then
    over a minute away."""
    kubectl("label", "namespace", namespace, "--overwrite",
            "pod-security.kubernetes.io/enforce=restricted")
    member = server("a")
    member["spec"]["storage"] = {"hostPath": "/var/lib/modelpool/models"}
    apply(kubectl, namespace, member, pool(["a"], default="a", budget="300s"))

    ready, reconciling = await ready_reason(
        reconciler, "FailedCreate", "the pool to say its member's pods cannot be created")
    assert ready["status"] == "False"
    assert ready["message"].startswith("a cannot be created: "), ready
    assert 'violates PodSecurity "restricted' in ready["message"], ready
    assert "hostPath" in ready["message"], ready
    assert reconciling is not None and reconciling["status"] == "True"
    assert reconciling["reason"] == "FailedCreate"
    await event_seen(kubectl, namespace, "slot", "FailedCreate")

    said = await condition_when(reconciler, "modelservers", "a", "Ready",
                                lambda c: c["reason"] == "FailedCreate",
                                "the ModelServer to say its pods cannot be created")
    assert said["message"] == ready["message"], (said, ready)

    # The ReplicaSet controller retries a refused pod after a backoff that doubles from
    # 5 ms with each failure and is reset by a success alone: after 15 failures its next
    # try is 5 ms x 2^14 = 82 s away. The reconciler's retries (every 2 s here) count too.
    async def failures() -> int | None:
        events = kubectl.json("get", "events", "-n", namespace)["items"]
        n = sum(int(e.get("count") or 1) for e in events
                if (e.get("involvedObject") or {}).get("kind") == "ReplicaSet"
                and e.get("reason") == "FailedCreate")
        return n if n >= 15 else None

    await eventually(failures, "15 refused creations of a's pod", 240)
    kubectl("label", "namespace", namespace, "--overwrite",
            "pod-security.kubernetes.io/enforce=privileged")
    relabelled = time.monotonic()
    body = await ready_with(reconciler, "a")
    resident = condition(body, "Ready")
    assert resident is not None and resident["reason"] == "Resident"
    waited = time.monotonic() - relabelled
    assert waited < 40, f"a loaded {waited:.0f}s after its pods were allowed"
    deployment = kubectl.json("get", "deployment", "a", "-n", namespace)
    assert CREATE_RETRIED in deployment["metadata"]["annotations"], deployment["metadata"]


@contextlib.asynccontextmanager
async def refusing(kubectl: Any, namespace: str, group: str, resource: str, expression: str,
                   probe: Json) -> AsyncIterator[None]:
    """A ValidatingAdmissionPolicy of the cluster's, bound to `namespace`, that refuses
    `resource` objects for which `expression` is false ("... is not allowed here"); in
    force (a dry run of `probe` is refused) on entry, gone on exit."""
    name = f"refuse-{resource}-{namespace}"[:253]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": [resource]}]},
            "validations": [{"expression": expression,
                             "message": f"this {resource[:-1]} is not allowed here"}]},
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }
    kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                    "items": [policy, binding]}))
    try:
        async def enforced() -> bool | None:
            result = kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                             input=json.dumps(probe), check=False)
            return True if "is not allowed here" in result.stderr else None

        await eventually(enforced, f"the policy on {resource} to be enforced", 30)
        yield
    finally:
        kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
                check=False)


def _pod_labelled(labels: dict[str, str]) -> Json:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}


async def test_a_rendered_object_the_api_server_refuses_stalls_its_server_saying_why(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """An admission policy of the cluster's refuses the server's Deployment. The
    ModelServer says so (Stalled, with the policy's words, and an Event) rather than only
    the reconciler's log, and recovers once the policy is gone."""
    pod = _pod_labelled({"a": "b"})
    probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "blocked"},
             "spec": {"selector": {"matchLabels": {"a": "b"}},
                      "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod["spec"]}}}
    async with refusing(kubectl, namespace, "apps", "deployments",
                        "object.metadata.name != 'blocked'", probe):
        apply(kubectl, namespace, server("blocked"))

        said = await condition_when(reconciler, "modelservers", "blocked", "Stalled",
                                    lambda c: c["status"] == "True",
                                    "the ModelServer to say its Deployment was refused")
        assert said["reason"] == "ApplyRefused"
        assert said["message"].startswith("Deployment blocked was refused: "), said
        assert "this deployment is not allowed here" in said["message"], said
        await event_seen(kubectl, namespace, "blocked", "ApplyRefused")

    async def recovered() -> Json | None:
        body = await reconciler.get("modelservers", "blocked")
        c = condition(body, "Stalled")
        ready = (body.get("status") or {}).get("readyReplicas")
        return body if c is not None and c["status"] == "False" and ready == 1 else None

    await eventually(recovered, "the ModelServer to run once the policy is gone", 90)


async def test_router_pods_that_cannot_be_created_are_reported_on_the_router(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """An admission policy refuses the router's pods (not its Deployment): no pod says
    why, so the ModelRouter's Ready condition does, from the Deployment."""
    async with refusing(kubectl, namespace, "", "pods",
                        "!has(object.metadata.labels) || "
                        "!('modelpool.dev/router' in object.metadata.labels)",
                        _pod_labelled({"modelpool.dev/router": "chat"})):
        apply(kubectl, namespace, server("a"), router(["a"]))

        said = await condition_when(reconciler, "modelrouters", "chat", "Ready",
                                    lambda c: c["reason"] == "FailedCreate",
                                    "the router to say its pods cannot be created")
        assert said["status"] == "False"
        assert said["message"].startswith("0/1 router pods Ready; one cannot be created: "), said
        assert "this pod is not allowed here" in said["message"], said

    await condition_when(reconciler, "modelrouters", "chat", "Ready",
                         lambda c: c["status"] == "True",
                         "the router to run once the policy is gone", 90)


async def test_a_member_that_crashes_on_start_is_reported_with_how_it_ended(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """The member's server exits at once (a setting it cannot read), and the kubelet
    backs off restarting it. The pool and the ModelServer say so, with the kubelet's
    reason and the exit code, and the pool loads it once the spec is mended."""
    broken = server("a")
    broken["spec"]["env"] = [{"name": "FAKE_MODEL_LOAD_TIME", "value": "never"}]
    apply(kubectl, namespace, broken, pool(["a"], default="a", budget="300s"))

    ready, _ = await ready_reason(reconciler, "CrashLoopBackOff",
                                  "the pool to say its member crashes")
    assert ready["status"] == "False"
    assert ready["message"].startswith("a is not starting: container "), ready
    assert "exited 2, Error)" in ready["message"], ready  # a bad setting exits 2
    await event_seen(kubectl, namespace, "slot", "CrashLoopBackOff")
    said = condition(await reconciler.get("modelservers", "a"), "Ready")
    assert said is not None and said["reason"] == "CrashLoopBackOff", said

    apply(kubectl, namespace, server("a"))
    body = await ready_with(reconciler, "a")
    resident = condition(body, "Ready")
    assert resident is not None and resident["reason"] == "Resident"


async def test_a_terminating_incumbent_keeps_the_target_down_until_its_pod_is_gone(
    reconciler: Running, kubectl: Any, namespace: str, api: kr8s.asyncio.Api
) -> None:
    """Terminating pods still hold the GPU. The incumbent takes seconds to unload after
    SIGTERM, and nothing but the reconciler stops the target from starting meanwhile (the
    members ask for no GPU, so the scheduler admits both at once): the target's pod is
    placed only after the incumbent's pod is gone, as a watch of every pod event shows.
    It is created before (staged while the incumbent unloads), behind its slot gate."""
    apply(kubectl, namespace, server("a", unload_time=3), server("b"), pool(["a", "b"]))
    await ready_with(reconciler, "a")
    async with sampling(reconciler.kube, namespace) as samples:
        await reconciler.request("b")
        await ready_with(reconciler, "b")
    assert {"a"} in samples and {"b"} in samples, samples
    assert all(len(s) <= 1 for s in samples), [s for s in samples if len(s) > 1]
    body = await reconciler.pool()
    assert body["status"]["lastSwap"]["outcome"] == "Succeeded"


async def test_a_field_the_spec_no_longer_asks_for_leaves_the_rendered_object(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """`scratch: false` takes the volumes out of a server's Deployment, and nothing else:
    the Deployment the API server holds still has every field of the new rendering, so
    only a reconciler that knows it rendered something else before applies it again
    (server-side apply then drops what its field manager no longer sets)."""
    def volumes() -> tuple[list[str], list[str]] | None:
        got = kubectl.json_or_none("get", "deployment", "s", "-n", namespace)
        if got is None:
            return None
        pod = got["spec"]["template"]["spec"]
        return ([v["name"] for v in pod.get("volumes", [])],
                [m["name"] for m in pod["containers"][0].get("volumeMounts", [])])

    standalone = server("s", runtime="generic")
    apply(kubectl, namespace, standalone)

    async def serving() -> bool | None:  # past the settling time a pool may claim it in
        phase = ((await reconciler.get("modelservers", "s")).get("status") or {}).get("phase")
        return True if phase == "Ready" and replicas(kubectl, namespace, "s") == 1 else None

    await eventually(serving, "s Ready with its one replica", 60)
    assert volumes() == (["tmp"], ["tmp"])
    standalone["spec"]["scratch"] = False
    apply(kubectl, namespace, standalone)

    async def dropped() -> bool | None:
        return True if volumes() == ([], []) else None

    await eventually(dropped, "s's volumes gone from its Deployment", 20)


def _policy_routers(kubectl: Any, namespace: str, name: str) -> list[str] | None:
    """The routers the member's NetworkPolicy admits ([] for the reconciler alone), or
    None when there is no policy."""
    policy = kubectl.json_or_none("get", "networkpolicy", name, "-n", namespace)
    if policy is None:
        return None
    peers = policy["spec"]["ingress"][0]["from"]
    for peer in peers:
        for expression in (peer.get("podSelector") or {}).get("matchExpressions") or []:
            if expression["key"] == "modelpool.dev/router":
                return list(expression["values"])
    return []


async def test_a_members_network_policy_follows_its_routers_and_goes_with_it(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """The member's NetworkPolicy, owned by its ModelServer, admits the routers that front
    it as they come and go; `allowDirectAccess` prunes it; deleting the ModelServer has it
    collected by the garbage collector. No replicas: no pod event re-renders the member, so
    only a router's own change can."""
    quiet = server("a")
    quiet["spec"]["replicas"] = 0
    apply(kubectl, namespace, quiet)

    async def admits(expected: list[str] | None) -> bool | None:
        return True if _policy_routers(kubectl, namespace, "a") == expected else None

    await eventually(lambda: admits([]), "a's policy admitting the reconciler alone", 30)
    policy = kubectl.json("get", "networkpolicy", "a", "-n", namespace)
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ModelServer", "a", True)
    async def named() -> bool | None:
        status = kubectl.json("get", "modelserver", "a", "-n", namespace).get("status") or {}
        return True if status.get("networkPolicy") == "a" else None

    await eventually(named, "a's status naming its policy", 30)
    described = kubectl("describe", "modelserver", "a", "-n", namespace).stdout
    assert re.search(r"^\s*Network Policy:\s+a$", described, re.MULTILINE), described
    apply(kubectl, namespace, router(["a"]), router(["a"], name="edge"))
    await eventually(lambda: admits(["chat", "edge"]), "a's policy admitting both routers", 30)
    kubectl("delete", "modelrouter", "edge", "-n", namespace)
    await eventually(lambda: admits(["chat"]), "edge gone from a's policy", 30)
    kubectl("patch", "modelserver", "a", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"allowDirectAccess": True}}))
    await eventually(lambda: admits(None), "a's policy pruned", 30)

    async def unnamed() -> bool | None:
        status = kubectl.json("get", "modelserver", "a", "-n", namespace).get("status") or {}
        return True if "networkPolicy" not in status else None

    await eventually(unnamed, "a's status naming no policy", 30)
    kubectl("patch", "modelserver", "a", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"allowDirectAccess": False}}))
    await eventually(lambda: admits(["chat"]), "a's policy back", 30)
    kubectl("delete", "modelserver", "a", "-n", namespace)
    await eventually(lambda: admits(None), "a's policy collected with its ModelServer", 60)


async def test_a_resident_that_served_nothing_for_idle_unload_after_is_unloaded(
    reconciler: Running, kubectl: Any, namespace: str
) -> None:
    """spec.idleUnloadAfter: requests keep the resident loaded past it; once they stop it
    is unloaded, the pool is Cold (not the default loaded again) and says why, and the
    next request loads a member."""
    idle = pool(["a", "b"])
    idle["spec"]["idleUnloadAfter"] = "3s"
    apply(kubectl, namespace, server("a"), server("b"), idle)
    await ready_with(reconciler, "a")
    pods, _ = await reconciler.kube.list_all(PODS, namespace, "modelpool.dev/model-server=a")
    ip = pods[0]["status"]["podIP"]
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        # twice idleUnloadAfter of traffic: a 0.1 s request a second, so most probes find
        # the member idle and only its served-request mark shows it is used
        while time.monotonic() - started < 6:
            async with session.post(f"http://{ip}:8080/v1/completions",
                                    json={"model": "a", "prompt": "hi", "max_tokens": 1}) as r:
                assert r.status == 200
            status = (await reconciler.pool()).get("status") or {}
            assert status.get("residentMember") == "a", status
            await asyncio.sleep(1.0)  # the traffic's pace, not a wait for anything

    async def cold() -> Json | None:
        body = await reconciler.pool()
        return body if (body.get("status") or {}).get("phase") == "Cold" else None

    body = await eventually(cold, "the pool Cold once a served nothing for 3s", 30)
    unloaded = body["status"]["idleUnloaded"]
    assert unloaded["member"] == "a" and unloaded["idleSeconds"] >= 3, unloaded
    assert body["status"].get("residentMember") is None
    ready = condition(body, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "IdleUnloaded")
    await event_seen(kubectl, namespace, "slot", "IdleUnloaded")

    async def gone() -> bool | None:
        left, _ = await reconciler.kube.list_all(PODS, namespace, "modelpool.dev/model-server")
        return True if not [p for p in left if _active_member(p)] else None

    await eventually(gone, "a's pod gone, the GPU free", 30)
    assert reconciler.sample("modelpool_idle_unloads_total", pool="slot", member="a") == 1
    assert ((await reconciler.pool()).get("status") or {}).get("phase") == "Cold"
    await reconciler.request("a")
    body = await ready_with(reconciler, "a")
    assert body["status"].get("idleUnloaded") is None
