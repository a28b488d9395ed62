"""The swap's shell (`reconciler.controller`, `reconciler.pools`) over a fake of our own
`Kube` port: the order in which a pool's reconcile performs what the state machine
decided, and which keys a watch event wakes.

What a swap waits on goes first: the target's scale-up is sent before the pool's status
write, an idle probe starts before it, and an Event never holds the next step back. A
status-only change of a pool (a router's request, our own write) wakes only the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from reconciler import swap as s
from reconciler.controller import Controller
from reconciler.idle import IdleCheck
from reconciler.kube import Kube, KubeError, Resource
from reconciler.metrics import ReconcilerMetrics
from reconciler.probes import Reading
from reconciler.render import Renderer
from reconciler.settings import Settings
from reconciler.stores import POOL, ROUTER, SERVER, Key
from reconciler.workqueue import WorkQueue

pytestmark = pytest.mark.unit

NS = "ns"
GROUP = "modelpool.dev/v1alpha1"
NOW = 1_000_000.0


class FakeKube(Kube):
    """Records every write in order, as it completes; Events can be held back to prove
    nobody waits for them."""

    def __init__(self) -> None:
        super().__init__(api=None)
        self.calls: list[tuple[str, str, str]] = []
        self.patches: list[Any] = []
        self.release_events = asyncio.Event()
        self.release_events.set()

    def _echo(self, body: Any, kind: str, namespace: str, name: str) -> dict[str, Any]:
        meta = {"namespace": namespace, "name": name, "resourceVersion": str(len(self.calls))}
        if isinstance(body, dict):
            return {**body, "kind": kind, "metadata": {**(body.get("metadata") or {}), **meta}}
        return {"kind": kind, "metadata": meta}

    async def apply(self, body: Any, *, force: bool = True) -> dict[str, Any]:
        meta = body["metadata"]
        self.calls.append(("apply", body["kind"], meta["name"]))
        return self._echo(body, body["kind"], meta["namespace"], meta["name"])

    async def delete(self, resource: Resource, namespace: str | None, name: str,
                     uid: str | None = None) -> None:
        self.calls.append(("delete", resource.kind, name))

    async def strategic_merge_patch(self, resource: Resource, namespace: str | None,
                                    name: str, patch: Any) -> dict[str, Any]:
        self.calls.append(("patch", resource.kind, name))
        self.patches.append(patch)
        return self._echo(patch, resource.kind, namespace or "", name)

    async def merge_patch_status(self, resource: Resource, namespace: str, name: str,
                                 status: Any) -> dict[str, Any]:
        await asyncio.sleep(0)  # a write takes a while: what runs beside it runs now
        self.calls.append(("status", resource.kind, name))
        return self._echo({"status": dict(status)}, resource.kind, namespace, name)

    async def post_event(self, involved: Any, *, type_: str, reason: str, message: str,
                         now: float, instance: str) -> None:
        await self.release_events.wait()
        self.calls.append(("event", reason, involved["metadata"]["name"]))


class FakeProbe:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.mark = "0:1"

    async def probe(self, check: IdleCheck, addresses: Sequence[tuple[str, int]]
                    ) -> tuple[s.Verdict, str]:
        self.kube.calls.append(("probe", str(check.method), ",".join(a for a, _ in addresses)))
        return s.Verdict.IDLE, ""

    async def activity(self, check: IdleCheck, addresses: Sequence[tuple[str, int]]
                       ) -> Reading:
        self.kube.calls.append(("activity", str(check.method),
                                ",".join(a for a, _ in addresses)))
        return Reading(s.Verdict.IDLE, "", self.mark)


def server(name: str) -> dict[str, Any]:
    return {
        "apiVersion": GROUP, "kind": "ModelServer",
        # newer than any echo of a status write, which carries no spec
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}", "generation": 1,
                     "creationTimestamp": "2026-11-30T10:00:00Z",
                     "resourceVersion": "1000000"},
        "spec": {"runtime": "llamacpp", "image": "modelpool/fake-model:test",
                 "model": f"/models/{name}.gguf", "resources": {"gpu": 1}},
    }


def pool_body(status: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": GROUP, "kind": "ModelPool",
        "metadata": {"namespace": NS, "name": "slot", "uid": "uid-slot",
                     "generation": generation, "resourceVersion": "1"},
        "spec": {"members": [{"name": "a"}, {"name": "b"}], "default": "a",
                 "swapBudget": "300s"},
        "status": status or {},
    }


def router_body() -> dict[str, Any]:
    return {
        "apiVersion": GROUP, "kind": "ModelRouter",
        "metadata": {"namespace": NS, "name": "chat", "uid": "uid-chat", "generation": 1},
        "spec": {"backends": [{"name": m, "modelServerRef": {"name": m}} for m in "ab"],
                 "defaultRoute": "a"},
    }


def pod(member: str, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": NS, "name": f"{member}-1",
                     "labels": {"modelpool.dev/model-server": member}},
        "spec": {"nodeName": "node"},
        "status": {"phase": "Running", "podIP": "127.1.0.9",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def gated(member: str) -> dict[str, Any]:
    """A member's pod as its ReplicaSet creates it: unplaced, behind the slot gate."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": NS, "name": f"{member}-2",
                     "labels": {"modelpool.dev/model-server": member}},
        "spec": {"schedulingGates": [{"name": "modelpool.dev/slot"}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]},
    }


def controller(kube: FakeKube, pods: Sequence[dict[str, Any]] = ()) -> Controller:
    c = Controller(kube, Settings(namespace=NS), ReconcilerMetrics(CollectorRegistry()),
                   Renderer(), FakeProbe(kube), clock=lambda: NOW)
    for name in ("a", "b"):
        c.servers.cache[(NS, name)] = server(name)
    c.pools.cache[(NS, "slot")] = pool_body()
    c.routers.cache[(NS, "chat")] = router_body()
    for p in pods:
        c.pods.cache[(NS, p["metadata"]["name"])] = p
    return c


def config() -> s.PoolConfig:
    return s.PoolConfig(members=("a", "b"), default="a", swap_budget=300.0)


def draining_a_to_b(c: Controller) -> None:
    """A swap a -> b for request 3, draining a (its Deployment at 1, its idle probe out)."""
    c.deployments.cache[(NS, "a")] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": "a", "resourceVersion": "1"},
        "spec": {"replicas": 1}}
    draining = s.Swap(from_="a", to="b", generation=3, phase=s.Phase.DRAINING,
                      started=NOW - 1, phase_started=NOW - 1, probe_in_flight=True)
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(
        config=config(), generation=1, request=s.Request("b", 3), resident="a",
        resident_since=NOW - 60, swap=draining, observed=s.MemberPods(pods={"a": 1}))


def queued(c: Controller) -> set[Key]:
    keys = set()
    while len(c.queue):
        key = c.queue._queue.popleft()
        c.queue._dirty.discard(key)
        keys.add(key)
    return keys


def index(calls: list[tuple[str, str, str]], call: tuple[str, str, str]) -> int:
    assert call in calls, (call, calls)
    return calls.index(call)



def swap_state(c: Any) -> s.PoolState:
    """The exclusive pool's swap state the shell keeps."""
    state = c.pool_reconciler.states[(NS, "slot")]
    assert isinstance(state, s.PoolState)
    return state

async def test_the_staged_target_is_released_before_the_pool_status_is_written() -> None:
    kube = FakeKube()
    c = controller(kube, [gated("b")])  # the incumbent's pods are gone
    unloading = s.Swap(from_="a", to="b", generation=3, phase=s.Phase.UNLOADING,
                       started=NOW - 1, phase_started=NOW - 1)
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(
        config=config(), generation=1, request=s.Request("b", 3), resident=None,
        swap=unloading, observed=s.MemberPods(pods={"a": 1, "b": 1}))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    state = swap_state(c)
    assert state.swap is not None and state.swap.phase is s.Phase.LOADING
    release = index(kube.calls, ("patch", "Pod", "b-2"))
    assert release < index(kube.calls, ("status", "ModelPool", "slot"))
    assert kube.patches == [{"spec": {"schedulingGates": [
        {"$patch": "delete", "name": "modelpool.dev/slot"}]}}]


async def test_a_staged_target_stays_gated_while_the_incumbent_unloads() -> None:
    kube = FakeKube()
    going = pod("a")
    going["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    c = controller(kube, [going, gated("b")])
    unloading = s.Swap(from_="a", to="b", generation=3, phase=s.Phase.UNLOADING,
                       started=NOW - 1, phase_started=NOW - 1)
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(
        config=config(), generation=1, request=s.Request("b", 3), resident=None,
        swap=unloading, observed=s.MemberPods(pods={"a": 1, "b": 1}, terminating={"a": 1}))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    state = swap_state(c)
    assert state.swap is not None and state.swap.phase is s.Phase.UNLOADING
    assert not [call for call in kube.calls if call[0] == "patch"], kube.calls


async def test_a_residents_new_pod_is_released_and_another_members_is_not() -> None:
    kube = FakeKube()
    c = controller(kube, [gated("a"), gated("b")])
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(
        config=config(), generation=1, resident="a", resident_since=NOW - 60,
        observed=s.MemberPods(pods={"a": 1, "b": 1}))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert [call for call in kube.calls if call[0] == "patch"] == [("patch", "Pod", "a-2")]


async def test_the_incumbent_is_scaled_down_before_the_pool_status_is_written() -> None:
    kube = FakeKube()
    c = controller(kube, [pod("a")])
    draining_a_to_b(c)
    c.pool_reconciler.idle_results[(NS, "slot")].append(s.IdleResult("a", s.Verdict.IDLE))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    scale_down = index(kube.calls, ("apply", "Deployment", "a"))
    assert scale_down < index(kube.calls, ("status", "ModelPool", "slot"))
    # the target is staged in the same step: its pod is created while a unloads
    stage = index(kube.calls, ("apply", "Deployment", "b"))
    assert stage < index(kube.calls, ("status", "ModelPool", "slot"))


async def test_a_swap_probes_the_incumbent_without_waiting_for_its_status_or_event() -> None:
    kube = FakeKube()
    kube.release_events.clear()  # the API server never answers the Event
    c = controller(kube, [pod("a")])
    c.pools.cache[(NS, "slot")] = pool_body({
        "phase": "Ready", "residentMember": "a", "residentSince": "2026-11-30T10:00:00Z",
        "request": {"member": "b", "generation": 3}})
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(
        config=config(), generation=1, resident="a", resident_since=NOW - 60,
        observed=s.MemberPods(pods={"a": 1}, scheduled={"a": 1}, ready={"a": 1}))
    await asyncio.wait_for(c.pool_reconciler.reconcile(Key(POOL, NS, "slot")), 5)
    # the probe runs in its own task (the Event's task stays blocked: not awaited)
    await asyncio.wait_for(asyncio.gather(
        *(t for t in c.ctx.background.tasks if t.get_name().startswith("probe-"))), 5)
    probe = index(kube.calls, ("probe", "slots", "127.1.0.9"))
    assert probe < index(kube.calls, ("status", "ModelPool", "slot"))
    assert not any(call[0] == "event" for call in kube.calls)  # still held back
    kube.release_events.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert ("event", "SwapStarted", "slot") in kube.calls
    assert Key(POOL, NS, "slot") in queued(c)  # the probe's answer wakes the pool


async def test_a_status_only_change_of_a_pool_wakes_only_the_pool() -> None:
    c = controller(FakeKube())
    c._on_pool("SYNC", pool_body())
    assert queued(c) == {Key(POOL, NS, "slot"), Key(SERVER, NS, "a"), Key(SERVER, NS, "b"),
                         Key(ROUTER, NS, "chat")}
    c._on_pool("MODIFIED", pool_body({"request": {"member": "b", "generation": 1}}))
    assert queued(c) == {Key(POOL, NS, "slot")}
    c._on_pool("MODIFIED", pool_body(generation=2))  # the spec changed
    assert queued(c) == {Key(POOL, NS, "slot"), Key(SERVER, NS, "a"), Key(SERVER, NS, "b"),
                         Key(ROUTER, NS, "chat")}


async def test_a_status_only_change_of_a_server_wakes_only_its_routers() -> None:
    c = controller(FakeKube())
    c.queue = WorkQueue()
    c._on_server("ADDED", server("b"))
    assert queued(c) == {Key(SERVER, NS, "b"), Key(POOL, NS, "slot"), Key(ROUTER, NS, "chat")}
    c._on_server("MODIFIED", {**server("b"), "status": {"phase": "Ready"}})
    assert queued(c) == {Key(ROUTER, NS, "chat")}


async def test_a_pool_seen_for_the_first_time_wakes_the_members_it_wants_scaled() -> None:
    # restored from status with `a` resident; a's Deployment was scaled to 0 meanwhile
    kube = FakeKube()
    c = controller(kube)
    c.pools.cache[(NS, "slot")] = pool_body({
        "phase": "Ready", "residentMember": "a", "residentSince": "2026-11-30T10:00:00Z"})
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert {Key(SERVER, NS, "a"), Key(SERVER, NS, "b")} <= queued(c)
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))  # nothing changed: nothing woken
    assert Key(SERVER, NS, "a") not in queued(c)


@pytest.mark.parametrize(("seen_for", "status", "phase", "reason", "warned"), [
    # this spec seen a moment ago (applied with its members, or a change that adds one)
    (1.0, {}, "Cold", "WaitingForMembers", False),
    # seen long enough: stalled, and said so once
    (60.0, {}, "Degraded", "MemberNotFound", True),
    # judged before (a restarted reconciler): stalled at once, no wait
    (0.0, {"observedGeneration": 1, "phase": "Degraded", "conditions": [
        {"type": "Stalled", "status": "True", "reason": "MemberNotFound", "message": "b",
         "lastTransitionTime": "2026-11-30T10:00:00Z", "observedGeneration": 1}]},
     "Degraded", "MemberNotFound", True),
])
async def test_a_pool_whose_member_is_missing_is_stalled_only_once_it_had_time_to_arrive(
    seen_for: float, status: dict[str, Any], phase: str, reason: str, warned: bool
) -> None:
    kube = FakeKube()
    c = controller(kube)
    del c.servers.cache[(NS, "b")]
    c.pools.cache[(NS, "slot")] = pool_body(status)
    if seen_for:
        c.ctx.settling.first_seen[Key(POOL, NS, "slot")] = (1, NOW - seen_for)
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    # the Events, posted beside it
    await asyncio.wait_for(asyncio.gather(*c.ctx.background.tasks), 5)
    written = c.pools.cache[(NS, "slot")]["status"]  # what the status patch wrote
    assert written.get("phase", status.get("phase")) == phase
    reasons = {x["type"]: x["reason"] for x in written["conditions"] if x["status"] == "True"}
    assert reason in reasons.values()
    assert (("event", "MemberNotFound", "slot") in kube.calls) is warned


async def test_a_pod_event_wakes_the_pool_before_the_server() -> None:
    c = controller(FakeKube())
    c._on_pod("DELETED", pod("a"))
    assert list(c.queue._queue) == [Key(POOL, NS, "slot"), Key(SERVER, NS, "a")]


class CountingRenderer(Renderer):
    def __init__(self) -> None:
        super().__init__()
        self.renders = 0

    def model_server(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        self.renders += 1
        return super().model_server(*args, **kwargs)


async def test_a_server_is_rendered_again_only_when_its_spec_or_scale_changed() -> None:
    kube = FakeKube()
    c = controller(kube)
    renderer = CountingRenderer()
    c.ctx.renderer = renderer
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(config=config(), resident="a",
                                              observed=s.MemberPods())  # a wanted at 1
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    assert renderer.renders == 1
    deployment = next(o for o in c.deployments.items(NS) if o["metadata"]["name"] == "a")
    deployment["spec"]["replicas"] = 7  # what was applied is not what is cached
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    assert renderer.renders == 1
    assert kube.calls.count(("apply", "Deployment", "a")) == 2  # put back, from the cache
    changed = server("a")
    changed["metadata"]["generation"] = 2
    changed["spec"]["args"] = ["--ctx-size", "4096"]
    c.servers.cache[(NS, "a")] = changed
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    assert renderer.renders == 2
    applied = next(o for o in c.deployments.items(NS) if o["metadata"]["name"] == "a")
    assert "4096" in str(applied["spec"]["template"]["spec"]["containers"][0]["args"])


async def test_a_scale_that_failed_is_retried_by_the_members_own_key() -> None:
    class FailingKube(FakeKube):
        async def apply(self, body: Any, *, force: bool = True) -> dict[str, Any]:
            raise KubeError("apply Deployment a: connection reset")

    kube = FailingKube()
    c = controller(kube, [pod("a")])
    draining_a_to_b(c)
    c.pool_reconciler.idle_results[(NS, "slot")].append(s.IdleResult("a", s.Verdict.IDLE))
    with pytest.raises(KubeError):
        await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert Key(SERVER, NS, "a") in c.queue._timers  # again after the backoff
    assert c.queue.failures(Key(SERVER, NS, "a")) == 1
    c.queue.shutdown()


class RaisingProbe:
    """A probe whose own code fails (not a model server answering an error status)."""

    async def probe(self, check: IdleCheck, addresses: Sequence[tuple[str, int]]
                    ) -> tuple[s.Verdict, str]:
        raise RuntimeError("the probe itself broke")

    async def activity(self, check: IdleCheck, addresses: Sequence[tuple[str, int]]
                       ) -> Reading:
        raise RuntimeError("the probe itself broke")


async def test_an_idle_probe_that_raises_fails_closed() -> None:
    kube = FakeKube()
    c = controller(kube, [pod("a")])
    c.ctx.probe = RaisingProbe()
    body = pool_body({
        "phase": "Ready", "residentMember": "a", "residentSince": "2026-11-30T10:00:00Z",
        "request": {"member": "b", "generation": 3}})
    body["metadata"]["resourceVersion"] = "1000000"  # the echoes of status writes carry no spec
    c.pools.cache[(NS, "slot")] = body
    c.pool_reconciler.states[(NS, "slot")] = s.PoolState(
        config=config(), generation=1, resident="a", resident_since=NOW - 60,
        observed=s.MemberPods(pods={"a": 1}, scheduled={"a": 1}, ready={"a": 1}))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await asyncio.gather(*c.ctx.background.tasks)
    assert c.pool_reconciler.idle_results[(NS, "slot")] == [
        s.IdleResult("a", s.Verdict.FAILED, "RuntimeError")]
    assert Key(POOL, NS, "slot") in queued(c)  # the answer wakes the pool

    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    state = swap_state(c)
    assert state.swap is not None and state.swap.phase is s.Phase.DRAINING
    assert state.swap.deferral == s.Deferral(
        s.IDLE_CHECK_FAILED, "idle check of a failed: RuntimeError")
    assert state.problem is None, state.problem
    assert s.desired_replicas(state) == {"a": 1, "b": 0}
    assert ("apply", "Deployment", "b") not in kube.calls
    assert state.resident == "a"


def stored(name: str) -> dict[str, Any]:
    body = server(name)
    body["spec"]["storage"] = {"pvc": "weights", "mountPath": "/models"}
    return body


async def test_a_swap_prewarms_its_target_on_the_incumbents_node_until_the_swap_ends(
) -> None:
    """spec.prewarm: the pod that reads b's weights is applied once the swap drains a, on
    a's node (once, not on every reconcile), left alone while b loads, and deleted once
    the swap is over."""
    kube = FakeKube()
    c = controller(kube, [pod("a")])
    c.servers.cache[(NS, "b")] = stored("b")
    draining_a_to_b(c)
    body = pool_body({"request": {"member": "b", "generation": 3}})
    body["metadata"]["resourceVersion"] = "1000000"  # the echoes of status writes carry no spec
    c.pools.cache[(NS, "slot")] = body
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert kube.calls.count(("apply", "Pod", "slot-prewarm")) == 1
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert kube.calls.count(("apply", "Pod", "slot-prewarm")) == 1  # once per swap
    # the incumbent's pod is gone: the swap scales b up, and the prewarm pod stays
    del c.pods.cache[(NS, "a-1")]
    c.pool_reconciler.idle_results[(NS, "slot")].append(s.IdleResult("a", s.Verdict.IDLE))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    state = swap_state(c)
    assert state.swap is not None and state.swap.phase is s.Phase.LOADING
    assert ("delete", "Pod", "slot-prewarm") not in kube.calls
    # b is Ready: the swap is over, and the prewarm pod goes, once
    c.pods.cache[(NS, "b-1")] = pod("b")
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    state = swap_state(c)
    assert state.swap is None and state.resident == "b"
    assert kube.calls.count(("delete", "Pod", "slot-prewarm")) == 1
    assert kube.calls.count(("apply", "Pod", "slot-prewarm")) == 1
    assert index(kube.calls, ("delete", "Pod", "slot-prewarm")) > index(
        kube.calls, ("apply", "Deployment", "b"))


async def test_a_prewarm_pod_left_from_an_earlier_swap_is_deleted_when_it_is_in_the_way(
) -> None:
    """A pod named `<pool>-prewarm` that an earlier swap left (for the other member) cannot
    be changed into this swap's reader (422): this swap goes without one, and the old pod
    is deleted once the swap ends, so the next swap's reader can be created."""

    class LeftOver(FakeKube):
        async def apply(self, body: Any, *, force: bool = True) -> dict[str, Any]:
            if body["kind"] == "Pod":
                self.calls.append(("refused", "Pod", body["metadata"]["name"]))
                raise KubeError("spec: Forbidden: pod updates may not change fields", 422)
            return await super().apply(body, force=force)

    kube = LeftOver()
    c = controller(kube, [pod("a")])
    c.servers.cache[(NS, "b")] = stored("b")
    draining_a_to_b(c)
    body = pool_body({"request": {"member": "b", "generation": 3}})
    body["metadata"]["resourceVersion"] = "1000000"
    c.pools.cache[(NS, "slot")] = body
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert kube.calls.count(("refused", "Pod", "slot-prewarm")) == 1  # not on every reconcile
    assert ("delete", "Pod", "slot-prewarm") not in kube.calls  # not while the swap runs
    del c.pods.cache[(NS, "a-1")]
    c.pool_reconciler.idle_results[(NS, "slot")].append(s.IdleResult("a", s.Verdict.IDLE))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    c.pods.cache[(NS, "b-1")] = pod("b")
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
    assert swap_state(c).swap is None
    assert kube.calls.count(("delete", "Pod", "slot-prewarm")) == 1


async def test_no_prewarm_without_a_model_volume_or_when_the_pool_turns_it_off() -> None:
    for storage, prewarm in ((False, True), (True, False)):
        kube = FakeKube()
        c = controller(kube, [pod("a")])
        if storage:
            c.servers.cache[(NS, "b")] = stored("b")
        body = pool_body({"request": {"member": "b", "generation": 3}})
        body["spec"]["prewarm"] = prewarm
        c.pools.cache[(NS, "slot")] = body
        draining_a_to_b(c)
        await c.pool_reconciler.reconcile(Key(POOL, NS, "slot"))
        assert not [call for call in kube.calls if call[1] == "Pod"], (storage, prewarm)
