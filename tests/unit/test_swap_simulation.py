"""The swap against a simulated cluster: random requests, probe answers, slow pods.

Holds the invariants that no table of cases can enumerate: two members' pods are never
placed at once (a pool member's pod is created gated and placed only once the shell lifts
its gate, for the members `released` names), a Scale action always agrees with the
replicas the pool wants, every swap ends within its budget, and a pool left alone settles
with one resident.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from reconciler import swap as s

pytestmark = pytest.mark.unit

MEMBERS = ("a", "b", "c")
BUDGET = 60.0


@dataclass
class FakePod:
    created_at: float
    terminating_since: float | None = None
    placed_at: float | None = None  # None while its scheduling gate is on


@dataclass
class FakeMember:
    """One member's Deployment: a pod created (gated) whenever replicas is 1 and no pod
    is live (a terminating one does not count, as for a ReplicaSet), placed once its gate
    is lifted, Ready a load time after that, gone a grace after it was told to terminate
    (at once if it was never placed, as the API server deletes an unbound pod)."""

    replicas: int = 0
    pods: list[FakePod] = field(default_factory=list)
    load_time: float = 3.0
    never_ready: bool = False

    def advance(self, now: float, grace: float) -> None:
        for pod in self.pods:
            if self.replicas == 0 and pod.terminating_since is None:
                pod.terminating_since = now
        self.pods = [p for p in self.pods
                     if p.terminating_since is None
                     or (p.placed_at is not None and now - p.terminating_since < grace)]
        if self.replicas == 1 and not any(p.terminating_since is None for p in self.pods):
            self.pods.append(FakePod(now))

    def exists(self) -> bool:
        return bool(self.pods)

    def count(self) -> int:
        return len(self.pods)

    def placed(self) -> int:
        return sum(1 for p in self.pods if p.placed_at is not None)

    def release(self, now: float) -> None:
        for pod in self.pods:
            if pod.placed_at is None and pod.terminating_since is None:
                pod.placed_at = now

    def terminating(self) -> int:
        return sum(1 for p in self.pods if p.terminating_since is not None)

    def ready(self, now: float) -> bool:
        return any(
            p.terminating_since is None
            and p.placed_at is not None
            and not self.never_ready
            and now - p.placed_at >= self.load_time
            for p in self.pods
        )


@dataclass
class Sim:
    rng: random.Random
    members: dict[str, FakeMember] = field(default_factory=dict)
    now: float = 0.0
    generation: int = 0

    def observed(self) -> s.MemberPods:
        pods = {m: f.count() for m, f in self.members.items() if f.exists()}
        placed = {m: f.placed() for m, f in self.members.items() if f.placed()}
        ready = {m: 1 for m, f in self.members.items() if f.ready(self.now)}
        terminating = {m: f.terminating() for m, f in self.members.items() if f.terminating()}
        return s.MemberPods(pods=pods, scheduled=placed, ready=ready, terminating=terminating)


@pytest.mark.parametrize("seed", range(24))
def test_random_traffic_never_runs_two_members_and_every_swap_ends(seed: int) -> None:
    rng = random.Random(seed)
    sim = Sim(rng, {m: FakeMember(load_time=rng.uniform(0.5, 8)) for m in MEMBERS})
    sim.members[rng.choice(MEMBERS)].never_ready = rng.random() < 0.3
    config = s.PoolConfig(
        members=MEMBERS,
        default=rng.choice([*MEMBERS, None]),
        swap_budget=BUDGET,
        min_residency=rng.choice([0.0, 5.0]),
        probe_interval=1.0,
        policy=rng.choice(["sticky", "reclaim"]),
        reclaim_after=rng.choice([10.0, 40.0]),
        idle_unload_after=rng.choice([None, 6.0, 30.0]),
    )
    state = s.PoolState(config=config)
    pending_probe: str | None = None
    pending_activity: str | None = None
    request: s.Request | None = None

    def feed(event: s.Event) -> None:
        nonlocal state, pending_probe, pending_activity
        state, actions = s.step(state, event, sim.now)
        wanted = s.desired_replicas(state)
        assert wanted is not None
        last_scale = {a.member: a.replicas for a in actions if isinstance(a, s.Scale)}
        for member, replicas in last_scale.items():
            assert wanted[member] == replicas, (member, replicas, state)
        for action in actions:
            if isinstance(action, s.ProbeIdle):
                pending_probe = action.member
            if isinstance(action, s.ProbeActivity):
                pending_activity = action.member
            if isinstance(action, s.ClearRequest):
                clear(action.generation)
        for member, replicas in wanted.items():
            sim.members[member].replicas = replicas
        released = s.released(state)
        assert len(released) <= 1 and all(wanted[m] == 1 for m in released), (released, state)
        for member in released:
            sim.members[member].release(sim.now)
        if state.swap is not None:
            assert sim.now - state.swap.started <= BUDGET + 0.5

    def clear(generation: int) -> None:
        nonlocal request
        if request is not None and request.generation == generation:
            sim.generation += 1
            request = s.Request(None, sim.generation)
            feed(s.RequestObserved(request))

    feed(s.MembersObserved(sim.observed()))
    for _ in range(2000):
        sim.now = round(sim.now + 0.5, 3)
        for fake in sim.members.values():
            fake.advance(sim.now, grace=rng.choice([0.5, 2.0]))
        placed = [m for m, f in sim.members.items() if f.placed()]
        assert len(placed) <= 1, sim.members
        feed(s.MembersObserved(sim.observed()))
        roll = rng.random()
        if roll < 0.02:
            sim.generation += 1
            request = s.Request(rng.choice([*MEMBERS, None]), sim.generation)
            feed(s.RequestObserved(request))
        if pending_probe is not None and rng.random() < 0.5:
            verdict = rng.choices(
                [s.Verdict.IDLE, s.Verdict.BUSY, s.Verdict.FAILED], weights=[6, 3, 1]
            )[0]
            member, pending_probe = pending_probe, None
            feed(s.IdleResult(member, verdict))
        if pending_activity is not None and rng.random() < 0.5:
            verdict = rng.choices(
                [s.Verdict.IDLE, s.Verdict.BUSY, s.Verdict.FAILED], weights=[8, 1, 1]
            )[0]
            member, pending_activity = pending_activity, None
            feed(s.ActivityResult(member, verdict, mark=rng.choice(["1", "1", "1", "2"])))
        feed(s.Tick())

    # left alone with idle probes, the pool settles: no swap runs, at most one resident
    for _ in range(400):
        sim.now = round(sim.now + 0.5, 3)
        for fake in sim.members.values():
            fake.advance(sim.now, grace=0.5)
        feed(s.MembersObserved(sim.observed()))
        if pending_probe is not None:
            member, pending_probe = pending_probe, None
            feed(s.IdleResult(member, s.Verdict.IDLE))
        if pending_activity is not None:
            member, pending_activity = pending_activity, None
            feed(s.ActivityResult(member, s.Verdict.IDLE, mark="same"))
        feed(s.Tick())
    if config.idle_unload_after is not None and state.swap is None:
        # idle 200 s: whatever was resident went, and nothing (not the default) came back
        assert state.resident is None and not any(f.exists() for f in sim.members.values())
    if config.policy == "reclaim":
        return  # a reclaim may be starting again: the invariants above are what counts
    assert state.swap is None or sim.members[state.swap.to].never_ready
    if state.swap is None and state.resident is not None:
        assert sim.members[state.resident].ready(sim.now)
