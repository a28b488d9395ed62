"""The budgeted pool against a simulated cluster: random requests, probe answers, slow pods.

Holds the invariants no table of cases can enumerate, at every step: the footprints of
the members with a placed pod (starting, running or terminating) never exceed the
budget, nor do those of the residents and the loads past their drain (an eviction
always makes the room its target needs); no member is evicted while the last probe of
it said busy or failed, or while a probe of it is still out; nothing is scaled up while
it still has a pod, and no member has two pods placed at once (a pod deleted under a
resident is replaced only once it is gone); a Scale agrees with the replicas the pool
wants; and every request is answered (loaded, rejected, abandoned, withdrawn) within
swapBudget of when it was written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from reconciler import residency as r

pytestmark = pytest.mark.unit

GIB = 1 << 30
BUDGET = 48 * GIB
SWAP_BUDGET = 60.0
TICK = 0.5
MEMBERS = ("a", "b", "c", "d", "huge")


@dataclass
class FakePod:
    created_at: float
    terminating_since: float | None = None
    placed_at: float | None = None  # None while its scheduling gate is on


@dataclass
class FakeMember:
    """One member's Deployment (Recreate): a pod created gated whenever replicas is 1 and
    no pod is live, placed once its gate is lifted, Ready a load time after, gone a grace
    after it was told to terminate (at once if it was never placed)."""

    replicas: int = 0
    pods: list[FakePod] = field(default_factory=list)
    load_time: float = 3.0
    never_ready: bool = False
    busy: bool = False
    served: int = 0

    def advance(self, now: float, grace: float) -> None:
        for pod in self.pods:
            if self.replicas == 0 and pod.terminating_since is None:
                pod.terminating_since = now
        self.pods = [p for p in self.pods
                     if p.terminating_since is None
                     or (p.placed_at is not None and now - p.terminating_since < grace)]
        if self.replicas == 1 and not any(p.terminating_since is None for p in self.pods):
            self.pods.append(FakePod(now))

    def placed(self) -> int:
        return sum(1 for p in self.pods if p.placed_at is not None)

    def release(self, now: float) -> None:
        for pod in self.pods:
            if pod.placed_at is None and pod.terminating_since is None:
                pod.placed_at = now

    def terminating(self) -> int:
        return sum(1 for p in self.pods if p.terminating_since is not None)

    def ready(self, now: float) -> bool:
        return any(p.terminating_since is None and p.placed_at is not None
                   and not self.never_ready and now - p.placed_at >= self.load_time
                   for p in self.pods)


@dataclass
class Sim:
    members: dict[str, FakeMember]
    footprints: dict[str, int]
    now: float = 0.0

    def observed(self) -> r.MemberPods:
        m = self.members
        return r.MemberPods(
            pods={n: len(f.pods) for n, f in m.items() if f.pods},
            scheduled={n: f.placed() for n, f in m.items() if f.placed()},
            ready={n: 1 for n, f in m.items() if f.ready(self.now)},
            terminating={n: f.terminating() for n, f in m.items() if f.terminating()},
        )

    def placed_footprint(self) -> int:
        return sum(self.footprints[n] * f.placed() for n, f in self.members.items())


def _config(rng: random.Random) -> r.ResidencyConfig:
    sizes = [8, 12, 16, 20, 24, 30]
    footprints = {m: rng.choice(sizes) * GIB for m in MEMBERS[:-1]}
    footprints["huge"] = BUDGET + GIB  # admission refuses it; the machine rejects it too
    return r.ResidencyConfig(
        members=MEMBERS,
        default=rng.choice([*MEMBERS[:-1], None]),
        policy=rng.choice(["sticky", "fair", "reclaim"]),
        swap_budget=SWAP_BUDGET,
        min_residency=rng.choice([0.0, 5.0, 20.0]),
        probe_interval=1.0,
        reclaim_after=rng.choice([10.0, 40.0]),
        priorities={m: rng.choice([0, 0, 1]) for m in MEMBERS},
        idle_unload_after=rng.choice([None, 8.0, 30.0]),
        gpu_memory=BUDGET,
        footprints=footprints,
    )


def run(seed: int, steps: int = 3000) -> None:
    """Drive one seeded pool; assert the invariants at every step."""
    rng = random.Random(seed)
    config = _config(rng)
    sim = Sim({m: FakeMember(load_time=rng.uniform(0.5, 8)) for m in MEMBERS},
              dict(config.footprints))
    sim.members[rng.choice(MEMBERS[:-1])].never_ready = rng.random() < 0.3
    state = r.initial_state(config)
    idle_probes: set[str] = set()
    activity_probes: set[str] = set()
    last_answer: dict[str, r.Verdict] = {}
    generation = 0
    request: r.Request | None = None
    written_at = 0.0

    def feed(event: r.Event) -> None:
        nonlocal state
        before = r.desired_replicas(state) or {}
        state, actions = r.step(state, event, sim.now)
        wanted = r.desired_replicas(state)
        assert wanted is not None
        last_scale = {a.member: a.replicas for a in actions if isinstance(a, r.Scale)}
        for member, replicas in last_scale.items():
            assert wanted[member] == replicas, (member, replicas, state)
            if replicas == 1:
                # loaded twice: scaled up while wanted already, or while it has a pod
                assert before.get(member, 0) == 0, (member, state)
                assert not sim.members[member].pods, (member, sim.members[member], state)
        for action in actions:
            if isinstance(action, r.RecordEviction):
                fake = sim.members[action.member]
                if any(p.terminating_since is None for p in fake.pods):
                    assert last_answer.get(action.member) is r.Verdict.IDLE, (action, state)
                    assert action.member not in idle_probes | activity_probes, (action, state)
                assert last_scale.get(action.member) == 0
            if isinstance(action, r.ProbeIdle):
                idle_probes.add(action.member)
            if isinstance(action, r.ProbeActivity):
                activity_probes.add(action.member)
            if isinstance(action, r.ClearRequest):
                clear(action.generation)
        for member, replicas in wanted.items():
            sim.members[member].replicas = replicas
        released = r.released(state)
        assert all(wanted[m] == 1 for m in released), (released, state)
        for member in released:
            sim.members[member].release(sim.now)
        assert sim.placed_footprint() <= BUDGET, (sim.members, state)
        # a replacement pod is placed only once the one it replaces is gone
        assert all(f.placed() <= 1 for f in sim.members.values()), (sim.members, state)
        # and the pool never promises more: every load past its drain has its room
        promised = set(state.residents) | {x.to for x in state.loads
                                           if x.phase is not r.Phase.DRAINING}
        assert sum(config.footprints[m] for m in promised) <= BUDGET, state
        for load in state.loads:
            assert sim.now - load.started <= SWAP_BUDGET + TICK, (load, state)

    def clear(cleared: int) -> None:
        nonlocal request, generation
        if request is not None and request.generation == cleared:
            generation += 1
            request = r.Request(None, generation)
            feed(r.RequestObserved(request))

    def answer(member: str, *, activity: bool) -> None:
        fake = sim.members[member]
        verdict = (r.Verdict.FAILED if rng.random() < 0.05
                   else r.Verdict.BUSY if fake.busy else r.Verdict.IDLE)
        last_answer[member] = verdict
        if activity:
            activity_probes.discard(member)
            feed(r.ActivityResult(member, verdict, mark=str(fake.served)))
        else:
            idle_probes.discard(member)
            feed(r.IdleResult(member, verdict))

    feed(r.SpecObserved(config, 1))
    feed(r.MembersObserved(sim.observed()))
    for _ in range(steps):
        sim.now = round(sim.now + TICK, 3)
        for fake in sim.members.values():
            fake.advance(sim.now, grace=rng.choice([0.5, 2.0, 4.0]))
            if rng.random() < 0.05:
                fake.busy = not fake.busy
            if fake.busy:
                fake.served += 1
            live = [p for p in fake.pods if p.terminating_since is None and p.placed_at]
            if live and rng.random() < 0.003:
                live[0].terminating_since = sim.now  # deleted: a node drained, say
        feed(r.MembersObserved(sim.observed()))
        if rng.random() < 0.04:
            generation += 1
            member = rng.choices([*MEMBERS, "stranger", None], [4, 4, 4, 4, 1, 1, 1])[0]
            request = r.Request(member, generation)
            written_at = sim.now
            feed(r.RequestObserved(request))
        for member in sorted(idle_probes):
            if rng.random() < 0.5:
                answer(member, activity=False)
        for member in sorted(activity_probes):
            if rng.random() < 0.5:
                answer(member, activity=True)
        feed(r.Tick())
        if request is not None and request.member is not None:
            answered = request.generation <= state.answered
            assert answered or sim.now - written_at <= SWAP_BUDGET + TICK, (request, state)

    # left alone, idle, with no requests: every load ends and nothing is left draining
    for fake in sim.members.values():
        fake.busy = False
    for _ in range(int(2 * SWAP_BUDGET / TICK)):
        sim.now = round(sim.now + TICK, 3)
        for fake in sim.members.values():
            fake.advance(sim.now, grace=0.5)
        feed(r.MembersObserved(sim.observed()))
        for member in sorted(idle_probes):
            answer(member, activity=False)
        for member in sorted(activity_probes):
            answer(member, activity=True)
        feed(r.Tick())
    for load in state.loads:
        assert load.reclaim or sim.members[load.to].never_ready, (load, state)
    for member in state.residents:
        assert sim.members[member].ready(sim.now) or sim.members[member].never_ready


@pytest.mark.parametrize("seed", range(12))
def test_random_traffic_keeps_the_budget_and_answers_every_request(seed: int) -> None:
    run(seed)
