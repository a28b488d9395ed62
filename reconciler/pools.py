"""The ModelPool reconciler: observe a pool's spec, its routers' request and its members'
pods, step its swap (`reconciler.swap`, pure; with a memory budget its residents,
`reconciler.residency`) and execute the actions the step returns:
scale a member, probe one for idleness, clear the request, post an Event, record a
metric. Then lift the slot gate of the members that may hold the slot, write the pool's
status and run its prewarm pod."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler import device_claim as dc
from reconciler import pool_status, residency_status, scheduling
from reconciler import residency as r
from reconciler import swap as s
from reconciler.context import Context
from reconciler.footprints import footprint_problem, footprints
from reconciler.idle import idle_check
from reconciler.kv_phases import (
    RecordKvAbandoned,
    RestoreResult,
    RestoreSlots,
    SaveResult,
    SaveSlots,
)
from reconciler.logs import ObjectLogger
from reconciler.objects import meta, pod_ready
from reconciler.prewarm import Prewarm
from reconciler.probes import Reading
from reconciler.render import LABEL_POOL, POOL_KINDS
from reconciler.servers import ServerReconciler
from reconciler.settling import WAITING_FOR_MEMBERS
from reconciler.slot_saves import SlotSaves, saved_members
from reconciler.spec import DEFAULT_GPU_RESOURCE, ModelPoolSpec, ModelServerSpec, SpecError
from reconciler.stores import POOL, SERVER, Key, Result

log = logging.getLogger(__name__)

MEMBER_NOT_FOUND = "MemberNotFound"
# Executed first, before the status write: the metrics (whoever sees the new status must
# find them already counted), then what the swap waits on.
RECORDED = (s.RecordSwap, s.RecordFailure, s.RecordDeferral, s.RecordIdleUnload,
            r.RecordEviction, r.RecordLoad, RecordKvAbandoned)
# What a budgeted pool's status has and an exclusive pool's must not.
BUDGETED_ONLY = tuple(k for k in residency_status.OWNED_KEYS if k not in pool_status.OWNED_KEYS)
State = s.PoolState | r.ResidencyState
FIRST = (s.ProbeIdle, s.ProbeActivity, s.Scale, SaveSlots, RestoreSlots)
# What is fed to a pool's next step from the work run beside its reconciles.
Answer = s.IdleResult | s.ActivityResult | SaveResult | RestoreResult


class PoolReconciler:
    def __init__(self, ctx: Context, servers: ServerReconciler, prewarm: Prewarm) -> None:
        self.ctx = ctx
        self.servers = servers
        self.prewarm = prewarm
        self.slot_saves = SlotSaves(ctx, servers.kv_prune)
        # Each pool's state, by (namespace, name): its swap (`swap`) or, with a memory
        # budget, its residents (`residency`); restored from status when first seen.
        self.states: dict[tuple[str, str], State] = {}
        # The answers of idle probes run beside the reconciles, fed to the pool's next step.
        self.idle_results: dict[tuple[str, str], list[Answer]] = defaultdict(list)

    def wanted(self, namespace: str, pool: str) -> dict[str, int] | None:
        """The replicas `pool` wants of each member; None while that cannot be known."""
        return _desired(self.states.get((namespace, pool)))

    async def reconcile(self, key: Key) -> Result:
        ctx = self.ctx
        namespace, name = key.namespace, key.name
        body = ctx.stores.pools.get(namespace, name)
        state_key = (namespace, name)
        if body is None:
            ctx.settling.forget(Key(POOL, namespace, name))
            self.prewarm.forget(namespace, name)
            gone = self.states.pop(state_key, None)
            if gone is not None:
                ctx.metrics.forget_pool(namespace, name, gone.config.members)
            return Result()
        status = body.get("status") or {}
        generation = int(meta(body).get("generation") or 0)
        prewarm = False
        result = Result()
        try:
            spec = ModelPoolSpec.from_body(body)
            prewarm = spec.prewarm
        except SpecError as e:
            config = s.PoolConfig(members=())
            problem: s.Problem | None = s.Problem("InvalidSpec", str(e))
            budgeted: ModelPoolSpec | None = None
            device: dc.Device | None = None
            pool_budget: int | None = None
        else:
            config = s.PoolConfig(
                members=spec.member_names,
                default=spec.default,
                policy=spec.swap_policy,
                swap_budget=spec.swap_budget_seconds,
                min_residency=spec.min_residency_seconds,
                probe_interval=ctx.settings.swap.probe_interval_seconds,
                reclaim_after=spec.reclaim_after_seconds,
                priorities={m.name: m.priority for m in spec.members},
                idle_unload_after=spec.idle_unload_after_seconds,
            )
            parsed, invalid = self._parsed_members(spec)
            device = ctx.lookups.device_of(spec)
            pool_budget, budget_problem = (
                dc.budget(spec, device, footprints(spec, parsed)) if spec.budgeted
                else (None, None))
            config = dataclasses.replace(config, **self._kv(namespace, parsed))
            problem = self._problem(spec, parsed, invalid,
                                    pool_budget if budget_problem is None else None
                                    ) or budget_problem
            budgeted = spec
            if problem is not None and problem.reason == MEMBER_NOT_FOUND:
                remaining = ctx.settling.remaining(POOL, body)
                if remaining is not None:
                    problem = _waiting(problem)
                    result = Result(remaining)
        now = ctx.clock()
        previous = self.states.get(state_key)
        if budgeted is not None and budgeted.budgeted:
            config = r.ResidencyConfig(
                **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)},
                gpu_memory=pool_budget or 0,
                # 0 where none is stated: the spec's problem then says so, and the pool
                # acts on nothing
                footprints={m: size or 0 for m, size in footprints(budgeted, parsed).items()})
        events: list[s.Event] = [
            s.SpecObserved(config, generation, problem),
            s.RequestObserved(pool_status.request_of(status)),
            s.MembersObserved(self._member_pods(namespace, config.members, budgeted, device)),
            *self.idle_results.pop(state_key, []),
            s.Tick(),
        ]
        actions: list[s.Action | r.Action] = []
        state: State
        if isinstance(config, r.ResidencyConfig):
            budget = (previous if isinstance(previous, r.ResidencyState)
                      else residency_status.restore(config, generation, status))
            for event in events:
                budget, more = r.step(budget, event, now)
                actions += more
            state = budget
            residents: str | set[str] | None = set(budget.residents)
            owned = residency_status.pool_status(budget, status, now)
            wake = r.next_wakeup(budget)
        else:
            swap = (previous if isinstance(previous, s.PoolState)
                    else pool_status.restore(config, generation, status))
            for event in events:
                swap, swap_actions = s.step(swap, event, now)
                actions += swap_actions
            state = swap
            residents = swap.resident
            owned = {**pool_status.pool_status(swap, status, now),
                     **dict.fromkeys(BUDGETED_ONLY)}
            wake = s.next_wakeup(swap)
        owned["device"] = (dc.status_of(device, pool_budget) if device is not None
                           else None)
        self.states[state_key] = state
        logger = ctx.writer.logger(body, log)
        # The claim pool's ResourceClaim, before any member is scaled: their pods reference
        # it (one the spec no longer asks for is pruned).
        await self._claim(body, budgeted, logger)
        ctx.metrics.pool_seen(namespace, name, config.members)
        # Metrics first: whoever sees the new status must find them already counted.
        for action in actions:
            if isinstance(action, RECORDED):
                await self._execute(namespace, name, action, logger)
        ctx.metrics.set_resident(namespace, name, config.members, residents)
        # Then what the swap waits on, at once: an idle probe, a scale. The swap's order
        # lives in the state machine (a target is scaled up only in the step that saw
        # the incumbent's pods gone), so the status write need not come first; should
        # the reconciler die between the two, the status it restores from is one step
        # behind and the swap resumes from there (at worst draining the incumbent again).
        # A member scaled twice in one reconcile (up, then back down by a swap abandoned
        # in a later step) is scaled once, to where the last step left it; while the
        # spec has a problem nothing is scaled: the member keeps whatever runs.
        scaling = _desired(state) is not None
        last_scale = {a.member: a for a in actions if isinstance(a, s.Scale)}
        for action in actions:
            if isinstance(action, s.Scale):
                if last_scale[action.member] is action:
                    await self._scale(namespace, action, logger, scaling)
            elif isinstance(action, FIRST):
                await self._execute(namespace, name, action, logger)
        # Level-based, so a pod the ReplicaSet creates later (a staged target, a
        # resident's pod replaced) is released by the pool's next reconcile, which its
        # creation triggers.
        released = (r.released(state) if isinstance(state, r.ResidencyState)
                    else s.released(state))
        await ctx.writer.release(namespace, released, logger)
        self._wake_members(namespace, previous, state, actions)
        # Then status, then cleared requests (after lastSwap, which is how routers learn
        # of an abandoned swap) and Events.
        await ctx.writer.write_status(ctx.stores.pools, body, owned)
        for action in actions:
            if not isinstance(action, (*RECORDED, *FIRST)):
                await self._execute(namespace, name, action, logger)
        # The prewarm reads the target's weights while the incumbent drains: an exclusive
        # pool's swap only (a budgeted pool's loads evict nobody when the target fits).
        await self.prewarm.sync(namespace, name, body,
                                state if prewarm and isinstance(state, s.PoolState) else None,
                                logger)
        if wake is not None:
            result = result.sooner(max(0.0, wake - ctx.clock()))
        return result

    async def _claim(self, body: Mapping[str, Any], spec: ModelPoolSpec | None,
                     logger: ObjectLogger) -> None:
        """Apply a claim pool's ResourceClaim; prune one the pool no longer claims. Nothing
        where the API server serves no ResourceClaims (a claim pool is stalled there)."""
        ctx = self.ctx
        if ctx.stores.claims is None:
            return
        keep: set[tuple[str, str]] = set()
        if spec is not None and spec.claim is not None:
            claim = ctx.renderer.pool_claim(spec, owner_uid=meta(body).get("uid"))
            await ctx.writer.apply_for(body, logger, [claim])
            keep.add(("ResourceClaim", str(claim["metadata"]["name"])))
        if spec is None:
            return  # a spec that does not parse: whatever it claimed stays
        await ctx.writer.prune(POOL_KINDS, spec.namespace, (LABEL_POOL, spec.name),
                               meta(body).get("uid"), keep)

    async def _execute(self, namespace: str, pool: str, action: s.Action | r.Action,
                       logger: ObjectLogger) -> None:
        """Perform one action of the swap's but a Scale (`_scale`)."""
        m = self.ctx.metrics
        if isinstance(action, s.ProbeIdle):
            self._start_probe(namespace, pool, action.member)
        elif isinstance(action, s.ProbeActivity):
            self._start_probe(namespace, pool, action.member, activity=True)
        elif isinstance(action, SaveSlots):
            self.slot_saves.save(namespace, action, functools.partial(self._answer, namespace,
                                                                      pool))
        elif isinstance(action, RestoreSlots):
            self.slot_saves.restore(namespace, action,
                                    functools.partial(self._answer, namespace, pool))
        elif isinstance(action, RecordKvAbandoned):
            m.kv_slots_total.labels(namespace, action.member, action.kind, "timeout").inc()
            logger.warning("%s of %s's slots abandoned at its cap", action.kind, action.member)
        elif isinstance(action, s.ClearRequest):
            if not await self.ctx.writer.clear_request(namespace, pool, action.generation,
                                                       logger):
                self.ctx.add(POOL, namespace, pool)
        elif isinstance(action, s.EmitEvent):
            # posted beside the reconcile: the swap's next step does not wait for it
            self.ctx.background.run(
                functools.partial(logger.event, action.type, action.reason, action.message),
                f"event-{action.reason}")
        elif isinstance(action, s.RecordSwap):
            m.swap_done(namespace, pool, action.from_, action.to, action.duration, action.phases)
        elif isinstance(action, s.RecordFailure):
            m.swap_failures_total.labels(namespace, pool, action.member, action.reason).inc()
        elif isinstance(action, s.RecordDeferral):
            m.swap_deferrals_total.labels(namespace, pool, action.reason).inc()
        elif isinstance(action, s.RecordIdleUnload):
            m.idle_unloads_total.labels(namespace, pool, action.member).inc()
        elif isinstance(action, r.RecordEviction):
            m.evictions_total.labels(namespace, pool, action.member, action.for_).inc()
        elif isinstance(action, r.RecordLoad):
            m.swap_done(namespace, pool, action.evicted[0] if action.evicted else None,
                        action.to, action.duration, action.phases)

    async def _scale(self, namespace: str, action: s.Scale, logger: ObjectLogger,
                     scaling: bool) -> None:
        """Run the member at the replicas `action` carries (`scaling`: the pool's spec has
        no problem; with one, the member is reconciled at whatever runs)."""
        logger.info("scaling %s to %d", action.member, action.replicas)
        key = Key(SERVER, namespace, action.member)
        try:
            if scaling:
                result = await self.servers.scale(key, action.replicas)
            else:
                result = await self.servers.reconcile(key)
        except Exception:
            # The swap has moved on and will not ask again: the member's own key
            # retries the scale (it reads the replicas the pool now wants).
            self.ctx.queue.retry(key)
            raise
        if result.requeue_after is not None:
            self.ctx.queue.add_after(key, result.requeue_after)

    def _answer(self, namespace: str, pool: str, answer: Answer) -> None:
        """Feed what work beside the reconcile found to the pool's next step."""
        self.idle_results[(namespace, pool)].append(answer)
        self.ctx.add(POOL, namespace, pool)

    def _kv(self, namespace: str, parsed: Mapping[str, ModelServerSpec]) -> dict[str, Any]:
        """The machines' view of the members that keep their KV cache: each one's cap,
        and those with saved slots (a manifest in status) to restore."""
        caps = {m: spec.kv_cache.save_timeout for m, spec in parsed.items()
                if spec.kv_cache is not None and spec.kv_cache.persist}
        servers = self.ctx.stores.servers
        bodies = {m: servers.get(namespace, m) or {} for m in caps}
        return {"kv_caps": caps, "kv_saved": saved_members(bodies)}

    def _start_probe(self, namespace: str, pool: str, member: str,
                     activity: bool = False) -> None:
        """An idle probe of a swap's incumbent or, with `activity`, of a resident under
        idleUnloadAfter: run beside the reconcile, its answer fed to the next step."""
        ctx = self.ctx

        def result(reading: Reading) -> s.IdleResult | s.ActivityResult:
            if activity:
                return s.ActivityResult(member, reading.verdict, reading.mark, reading.detail)
            return s.IdleResult(member, reading.verdict, reading.detail)

        body = ctx.stores.servers.get(namespace, member)
        try:
            spec = ModelServerSpec.from_body(body or {})
        except SpecError as e:
            self.idle_results[(namespace, pool)].append(
                result(Reading(s.Verdict.FAILED, str(e))))
            ctx.add(POOL, namespace, pool)
            return
        check = idle_check(spec.runtime, spec.idle)
        addresses = [
            (str(p["status"]["podIP"]), spec.port)
            for p in ctx.lookups.active_pods_of(namespace, member)
            if (p.get("status") or {}).get("podIP")
        ]

        async def run() -> None:
            try:
                if activity:
                    reading = await ctx.probe.activity(check, addresses)
                else:
                    reading = Reading(*await ctx.probe.probe(check, addresses))
            except Exception as e:  # fail closed, whatever went wrong
                log.warning("idle probe of %s/%s raised: %s", namespace, member, e)
                reading = Reading(s.Verdict.FAILED, type(e).__name__)
            self.idle_results[(namespace, pool)].append(result(reading))
            ctx.add(POOL, namespace, pool)

        ctx.background.start(run(), f"probe-{member}")

    def _wake_members(self, namespace: str, previous: State | None,
                      state: State, actions: Sequence[s.Action | r.Action]) -> None:
        """Reconcile the members whose wanted replicas changed in this step without a
        Scale action of their own (a pool first seen, a problem fixed): a status write
        of the pool no longer wakes every member."""
        after = _desired(state)
        if after is None:
            return
        before = _desired(previous)
        scaled = {a.member for a in actions if isinstance(a, s.Scale)}
        for member, replicas in after.items():
            if member not in scaled and (before is None or before.get(member) != replicas):
                self.ctx.add(SERVER, namespace, member)

    # Observing

    def _parsed_members(self, spec: ModelPoolSpec) -> tuple[dict[str, ModelServerSpec],
                                                           list[str]]:
        """The members' ModelServer specs that parse, and what is wrong with the others."""
        parsed, invalid = {}, []
        for m in spec.member_names:
            body = self.ctx.stores.servers.get(spec.namespace, m)
            if body is None:
                continue
            try:
                parsed[m] = ModelServerSpec.from_body(body)
            except SpecError as e:
                invalid.append(f"{m}: {e}")
        return parsed, invalid

    def _problem(self, spec: ModelPoolSpec, parsed: Mapping[str, ModelServerSpec],
                 invalid: Sequence[str], budget: int | None) -> s.Problem | None:
        servers = self.ctx.stores.servers
        missing = [m for m in spec.member_names if servers.get(spec.namespace, m) is None]
        if missing:
            return s.Problem(MEMBER_NOT_FOUND, "ModelServer not found: " + ", ".join(missing))
        shared = []
        for m in spec.member_names:
            others = [p for p in self.ctx.lookups.pools_of(spec.namespace, m) if p != spec.name]
            if others:
                shared.append(f"{m} (also in {', '.join(sorted(others))})")
        if shared:
            return s.Problem("MemberInTwoPools", "members of another pool: " + ", ".join(shared))
        if invalid:
            return s.Problem("InvalidMember", "; ".join(invalid))
        if spec.claim is not None and self.ctx.stores.claims is None:
            return dc.unsupported_problem(spec, self.ctx.claims_refused)
        return footprint_problem(spec, parsed, budget)

    def _member_pods(self, namespace: str, members: Sequence[str],
                     spec: ModelPoolSpec | None = None,
                     device: dc.Device | None = None) -> s.MemberPods:
        pods: dict[str, int] = {}
        scheduled: dict[str, int] = {}
        ready: dict[str, int] = {}
        unschedulable: dict[str, str] = {}
        terminating: dict[str, int] = {}
        failing: dict[str, tuple[str, str]] = {}
        member_pods = ((m, pod) for m in dict.fromkeys(members)
                       for pod in self.ctx.lookups.active_pods_of(namespace, m))
        for member, pod in member_pods:
            pods[member] = pods.get(member, 0) + 1
            if meta(pod).get("deletionTimestamp"):
                terminating[member] = terminating.get(member, 0) + 1
            if (pod.get("spec") or {}).get("nodeName"):
                scheduled[member] = scheduled.get(member, 0) + 1
            if pod_ready(pod):
                ready[member] = ready.get(member, 0) + 1
            refused = scheduling.refusal(pod)
            if refused is not None and member not in unschedulable:
                unschedulable[member] = self._unschedulable(namespace, member, refused, spec,
                                                            device)
            stuck = scheduling.container_failure(pod)
            if stuck is not None and member not in failing:
                failing[member] = (stuck[0], f"{member} is not starting: {stuck[1]}")
        not_created: dict[str, str] = {}
        deployments = self.ctx.stores.deployments
        for member in members:
            failure = scheduling.creation_failure(deployments.get(namespace, member) or {})
            if failure is not None and not pods.get(member):
                not_created[member] = f"{member} cannot be created: {failure}"
        return s.MemberPods(pods=pods, scheduled=scheduled, ready=ready,
                            unschedulable=unschedulable, terminating=terminating,
                            not_created=not_created,
                            failing={m: f for m, f in failing.items() if not ready.get(m)})

    def _unschedulable(self, namespace: str, member: str, message: str,
                       spec: ModelPoolSpec | None = None,
                       device: dc.Device | None = None) -> str:
        """The scheduler's refusal, naming the pods in view that hold the GPU it lacks; for
        a claim pool whose claim is not allocated, why not."""
        if spec is not None and spec.claim is not None and device is not None and (
                device.allocated is None):
            stores = self.ctx.stores
            why = dc.unallocated(spec.claim.device_class_name,
                                 stores.device_classes.items() if stores.device_classes
                                 else (),
                                 stores.slices.items() if stores.slices else ())
            return dc.explain(member, message, device.claim, spec.claim.device_class_name,
                              why)
        try:
            resource = ModelServerSpec.from_body(
                self.ctx.stores.servers.get(namespace, member) or {}).resources.gpu_resource
        except SpecError:
            resource = DEFAULT_GPU_RESOURCE
        return scheduling.explain(member, message, resource,
                                  scheduling.holders(self.ctx.stores.pods.items(), resource))


def _desired(state: State | None) -> dict[str, int] | None:
    """The replicas the pool wants of each member; None while that cannot be known."""
    if state is None:
        return None
    if isinstance(state, r.ResidencyState):
        return r.desired_replicas(state)
    return s.desired_replicas(state)


def _waiting(problem: s.Problem) -> s.Problem:
    """Missing members of a pool just applied or changed: waited for (`settling`)."""
    message = problem.message.replace("ModelServer not found", "waiting for ModelServer")
    return s.Problem(WAITING_FOR_MEMBERS, message, pending=True)


__all__ = ["PoolReconciler"]
