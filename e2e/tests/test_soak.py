"""Soak under faults: random traffic over three pooled models while things break.

One pool of three fake members (load 1 s), a router with two replicas, a reconciler with
two replicas electing a leader on a Lease in the test's namespace. Workers send random
requests for the three models to the router's ready pods (as a Service would spread them)
for a bounded time, while faults are injected one at a time, in turn:

- `idle-probe`: the resident's idle probe answers 500 for a while (the swap fails closed);
- `member-pod-deleted`: the loading member's pod is deleted in the middle of a swap;
- `router-pod-deleted`: one router pod is deleted (its Deployment replaces it);
- `reconciler-leader-killed`: the process of the Lease holder gets SIGKILL;
- `apiserver-restart`: kube-apiserver is stopped and started again (at most once every
  `APISERVER_RESTART_SPACING` seconds).

Checked throughout:
- never two members' processes alive at once: the node's processes are sampled every
  100 ms (each pod runs in its own directory, so a process says which pod it belongs to);
- every request ends in 200, or 503 with Retry-After, within the swap budget (plus the
  dispatch), and never hangs;
- a 502, 504 or broken connection is tolerated only during a fault and the self-heal bound
  after it;
- after each fault the pool serves again: a request sent after it answers 200.

Requests, swaps, faults and violations are printed and written to `soak.json` in the
test's temporary directory. The run lasts MODELPOOL_SOAK_SECONDS (or `--soak-seconds`,
when the conftest offers it; default 90) and at least one round of the five faults; a later
round restarts kube-apiserver only where its spacing falls within the run.
Restarting kube-apiserver would disturb every other user of a cluster, so the soak always
starts a cluster of its own (this module's `cluster` fixture overrides the shared one,
MODELPOOL_REUSE_CLUSTER notwithstanding) and takes it down afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from e2e import harness
from e2e.local import controlplane, processes
from e2e.local import fixtures as local_fixtures
from e2e.local.demo import follow
from e2e.local.fixtures import Kubectl

# The run's length: read once here, since the timeout marker needs it at import.
SOAK_SECONDS = float(os.environ.get("MODELPOOL_SOAK_SECONDS", "90"))
MODELS = ("alpha", "beta", "gamma")
POOL = "slot"
ROUTER = "soak"
SWAP_BUDGET = 30.0
# kube-controller-manager backs off its watches while kube-apiserver is away and forgets
# that backoff only after two quiet minutes: with a plain Deployment and `kubectl scale`
# (no modelpool code involved), the first scale-down after each of three restarts 10 s
# apart was acted on after 3, 29 and 87 s. A swap waits on that scale, so restarts closer
# together than this would measure the controller manager, not modelpool.
APISERVER_RESTART_SPACING = 150.0
# A held request ends by the budget; add the dispatch of a short reply and scheduling noise.
REQUEST_SLACK = 10.0
CLIENT_TIMEOUT = SWAP_BUDGET + 30.0  # past this a request "hangs"
SELF_HEAL = 10.0  # after a fault ends, broken requests are tolerated this long
RECOVERY = 90.0  # after a fault, the pool must serve every model again within this
WORKERS = 6
SAMPLE_SECONDS = 0.1
LEASE = "modelpool-reconciler"
RECONCILER_REPLICAS = 2
ROUTER_REPLICAS = 2

Json = dict[str, Any]


# The record and its judgement (pure)


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it."""

    start: float
    end: float
    model: str
    router: str
    status: int | None = None
    retry_after: str | None = None
    error: str | None = None
    # What the router said, for an answer other than 200 (its error message).
    said: str | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Fault:
    name: str
    start: float
    end: float | None = None
    detail: str = ""
    recovered_after: float | None = None


@dataclass(frozen=True)
class Violation:
    at: float
    what: str


def in_fault_window(at: float, faults: Sequence[Fault], heal: float) -> bool:
    """Whether `at` lies within a fault or the self-heal bound after it."""
    for fault in faults:
        end = fault.end if fault.end is not None else float("inf")
        if fault.start <= at <= end + heal:
            return True
    return False


def judge(
    outcome: Outcome, faults: Sequence[Fault], budget: float, slack: float, heal: float
) -> str | None:
    """Why `outcome` breaks the rules, or None when it keeps them."""
    if outcome.error == "timeout":
        return f"hung for {outcome.seconds:.1f}s ({outcome.model} via {outcome.router})"
    if outcome.seconds > budget + slack:
        return (f"took {outcome.seconds:.1f}s, over the budget {budget:g}s "
                f"(status {outcome.status}, {outcome.model})")
    if outcome.status == 200:
        return None
    if outcome.status == 503:
        if outcome.retry_after is None:
            return f"503 without Retry-After ({outcome.model})"
        return None
    if in_fault_window(outcome.start, faults, heal) or in_fault_window(outcome.end, faults,
                                                                        heal):
        return None
    what = f"status {outcome.status}" if outcome.status is not None else outcome.error
    said = f": {outcome.said}" if outcome.said else ""
    return f"{what} outside any fault ({outcome.model} via {outcome.router}){said}"


def pod_of_directory(directory: str, pods_dir: str, namespace: str) -> str | None:
    """The pod name of a process working in `directory`, if it is one of `namespace`'s."""
    prefix = f"{pods_dir}/{namespace}_"
    if not directory.startswith(prefix):
        return None
    rest = directory[len(prefix):].split("/", 1)[0]
    name, _, _uid = rest.rpartition("_")
    return name or None


def member_of_pod(pod: str, members: Sequence[str]) -> str | None:
    """A Deployment's pod is `<member>-<hash>-<suffix>`."""
    base = pod.rsplit("-", 2)[0]
    return base if base in members else None


# Sampling the node's processes


def running_members(pods_dir: Path, namespace: str, members: Sequence[str]) -> set[str]:
    """The members whose fake model server processes are alive right now."""
    found: set[str] = set()
    root = str(pods_dir)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            if not cwd.startswith(root):
                continue
            argv = (proc / "cmdline").read_bytes()
            state = next(
                (line for line in (proc / "status").read_text().splitlines()
                 if line.startswith("State:")), "")
        except OSError:
            continue
        if b"e2e.fake_model" not in argv or " Z " in f"{state} ":
            continue
        pod = pod_of_directory(cwd, root, namespace)
        member = member_of_pod(pod, members) if pod else None
        if member:
            found.add(member)
    return found


# The run


@dataclass
class Soak:
    kubectl: Kubectl
    cluster: controlplane.LocalCluster
    namespace: str
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    swaps: list[Json] = field(default_factory=list)
    samples: int = 0
    routers: list[str] = field(default_factory=list)
    pool: Json = field(default_factory=dict)
    member_pods: dict[str, Json] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        print(f"[soak +{self.now():7.2f}s] {text}", flush=True)

    def violation(self, what: str) -> None:
        self.violations.append(Violation(self.now(), what))
        self.say(f"VIOLATION: {what}")

    # Watches

    def on_pool(self, event: Json) -> None:
        status = event["object"].get("status") or {}
        last = status.get("lastSwap")
        if last and (not self.swaps or self.swaps[-1] != last):
            self.swaps.append(last)
            self.say(f"swap {last.get('from') or '(none)'} -> {last.get('to')}: "
                     f"{last.get('outcome')} in {float(last.get('durationSeconds') or 0):.2f}s"
                     + (f" ({last.get('reason')})" if last.get("reason") else ""))
        self.pool = status

    def on_router_pod(self, event: Json) -> None:
        pod = harness.pod_from(event["object"])
        ips = [ip for ip in self.routers if ip != pod.ip]
        if event.get("type") != "DELETED" and pod.ready and not pod.terminating and pod.ip:
            ips.append(pod.ip)
        self.routers = ips

    def on_member_pod(self, event: Json) -> None:
        obj = event["object"]
        name = obj["metadata"]["name"]
        if event.get("type") == "DELETED":
            self.member_pods.pop(name, None)
        else:
            self.member_pods[name] = obj

    async def watch(self) -> None:
        kubectl = self.kubectl
        ns = self.namespace
        common = ("--watch", "--output-watch-events", "-o", "json")
        watches = {
            "pool": (kubectl_argv(kubectl, "get", f"modelpools.{harness.GROUP}", "-n", ns,
                                  *common), self.on_pool),
            "routers": (kubectl_argv(kubectl, "get", "pods", "-n", ns, "-l",
                                     f"{harness.LABEL_ROUTER}={ROUTER}", *common),
                        self.on_router_pod),
            "members": (kubectl_argv(kubectl, "get", "pods", "-n", ns, "-l",
                                     harness.LABEL_SERVER, *common), self.on_member_pod),
        }

        resets: dict[str, Callable[[], None]] = {
            "pool": lambda: None,
            "routers": self.routers.clear,
            "members": self.member_pods.clear,
        }

        async def keep(what: str) -> None:
            # A watch ends when the API server goes away: list and watch again from scratch
            # (what was deleted meanwhile sent no event).
            argv, handler = watches[what]
            first = True
            while not self.stop.is_set():
                if not first:
                    resets[what]()
                first = False
                await follow(argv, handler)
                await asyncio.sleep(0.5)

        await asyncio.gather(*(keep(what) for what in watches))

    async def sample(self) -> None:
        pods_dir = self.cluster.node_state_dir / "pods"
        while not self.stop.is_set():
            running = await asyncio.to_thread(running_members, pods_dir, self.namespace, MODELS)
            self.samples += 1
            if len(running) > 1:
                self.violation(f"two members running at once: {sorted(running)}")
            await asyncio.sleep(SAMPLE_SECONDS)

    # Traffic

    async def request(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        start = self.now()
        # No ready router endpoint (a watch restarting): wait as a client of a Service would.
        if not await self.wait_for(lambda: bool(self.routers), CLIENT_TIMEOUT):
            outcome = Outcome(start, self.now(), model, "-", error="timeout")
            self.outcomes.append(outcome)
            return outcome
        router = random.choice(self.routers)
        body = {"model": model, "messages": [{"role": "user", "content": "soak"}],
                "max_tokens": random.randint(1, 6)}
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT), session.post(
                f"http://{router}:{harness.ROUTER_PORT}/v1/chat/completions", json=body
            ) as response:
                answer = await response.read()
                outcome = Outcome(start, self.now(), model, router, response.status,
                                  response.headers.get("Retry-After"),
                                  said=None if response.status == 200 else said_by(answer))
        except TimeoutError:
            outcome = Outcome(start, self.now(), model, router, error="timeout")
        except aiohttp.ClientError as e:
            outcome = Outcome(start, self.now(), model, router, error=type(e).__name__)
        self.outcomes.append(outcome)
        return outcome

    async def worker(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        while not self.stop.is_set():
            await self.request(session, rng.choice(MODELS))
            await asyncio.sleep(rng.uniform(0.1, 1.5))

    # Faults

    def member_pod(self, member: str) -> harness.Pod | None:
        pods = [harness.pod_from(p) for p in self.member_pods.values()
                if member_of_pod(p["metadata"]["name"], MODELS) == member]
        live = [p for p in pods if not p.terminating]
        return live[0] if live else None

    async def wait_for(self, check: Callable[[], bool], within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if check():
                return True
            await asyncio.sleep(0.1)
        return False

    def resident_pod(self) -> harness.Pod | None:
        resident = self.pool.get("residentMember")
        pod = self.member_pod(str(resident)) if resident else None
        return pod if pod is not None and pod.ready and pod.ip else None

    def no_longer_resident(self, name: str) -> bool:
        pod = self.resident_pod()
        return pod is None or pod.name != name

    async def idle_probe(self, session: aiohttp.ClientSession, fault: Fault) -> None:
        deadline = self.now() + 40.0
        while True:
            await self.wait_for(lambda: self.resident_pod() is not None, deadline - self.now())
            resident = self.pool.get("residentMember")
            pod = self.resident_pod()
            if pod is None:
                fault.detail = "no resident pod to fault within 40s"
                return
            url = f"http://{pod.ip}:8080/fake/faults"
            try:
                async with session.put(url, json={"idleProbe": "fail"}) as response:
                    if response.status != 200:
                        fault.detail = f"the fault switch answered {response.status}"
                        return
                break
            except aiohttp.ClientConnectionError:
                # The workers' swaps may unload the resident between this read of the watch
                # and the connection: then the watch soon shows it gone, and the next
                # resident is faulted. A pod that stays the Ready resident while refusing
                # connections is a failure.
                gone = await self.wait_for(partial(self.no_longer_resident, pod.name), 10.0)
                if not gone or self.now() >= deadline:
                    raise
        failing_since = self.now()
        # Until the reconciler defers a swap for it, or 8 s without anyone asking for one.
        deferred = await self.wait_for(
            lambda: any(c.get("reason") == "IdleCheckFailed" and c.get("status") == "True"
                        for c in self.pool.get("conditions") or []), 8.0)
        fault.detail = (f"{resident} ({pod.name}) /slots answered 500 for "
                        f"{self.now() - failing_since:.1f}s"
                        + ("; a swap was deferred (IdleCheckFailed)" if deferred else ""))
        with contextlib.suppress(aiohttp.ClientError):
            async with session.put(url, json={"idleProbe": "ok"}) as response:
                await response.read()

    async def member_pod_deleted(self, fault: Fault) -> None:
        loading = await self.wait_for(
            lambda: (self.pool.get("swap") or {}).get("phase") == "Loading"
            and self.member_pod(str(self.pool["swap"].get("to"))) is not None, 40.0)
        if not loading:
            fault.detail = "no swap reached Loading within 40s"
            return
        target = str(self.pool["swap"]["to"])
        pod = self.member_pod(target)
        assert pod is not None
        await asyncio.to_thread(self.kubectl, "delete", "pod", pod.name, "-n", self.namespace,
                                "--wait=false")
        fault.detail = f"deleted {pod.name} while {target} was loading"

    async def router_pod_deleted(self, fault: Fault) -> None:
        pods = await asyncio.to_thread(harness.router_pods, self.kubectl, self.namespace,
                                       ROUTER)
        victim = random.choice([p for p in pods if not p.terminating])
        await asyncio.to_thread(self.kubectl, "delete", "pod", victim.name, "-n",
                                self.namespace, "--wait=false")
        fault.detail = f"deleted {victim.name}"
        await self.wait_for(lambda: len(self.routers) >= ROUTER_REPLICAS
                            and victim.ip not in self.routers, 60.0)

    async def reconciler_leader_killed(self, fault: Fault) -> None:
        lease = await asyncio.to_thread(
            self.kubectl.json, "get", "lease", LEASE, "-n", self.namespace)
        holder = lease["spec"].get("holderIdentity")
        pods = await asyncio.to_thread(
            harness.list_pods, self.kubectl, harness.SYSTEM_NAMESPACE,
            f"{harness.LABEL_SCOPE}={self.namespace}")
        leader = next((p for p in pods if p.name == holder), None)
        if leader is None or leader.pid is None:
            fault.detail = f"leader {holder} has no process to kill"
            return
        os.kill(leader.pid, signal.SIGKILL)
        fault.detail = f"SIGKILL to {holder} (pid {leader.pid})"

    async def apiserver_restart(self, fault: Fault) -> None:
        layout = self.cluster.layout
        await asyncio.to_thread(processes.stop, layout.pid("kube-apiserver"), 3.0)
        fault.detail = "kube-apiserver stopped"
        await asyncio.sleep(2.0)  # the outage itself, not a synchronisation
        options = controlplane.UpOptions(
            state_dir=self.cluster.state_dir, python=sys.executable,
            gpus=self.cluster.settings.gpus, bin_dir=self.cluster.bin_dir, timeout=120.0,
        )
        await asyncio.to_thread(controlplane.up, options)
        fault.detail += ", started again and healthy"

    async def serves_again(self, session: aiohttp.ClientSession) -> float | None:
        """Seconds until a request sent after the fault is answered 200 (one for the
        resident member, or the default when none is known), or None past RECOVERY."""
        start = self.now()
        while self.now() - start < RECOVERY:
            model = str(self.pool.get("residentMember") or MODELS[0])
            if (await self.request(session, model)).status == 200:
                return self.now() - start
            await asyncio.sleep(0.5)
        return None

    async def inject(self, session: aiohttp.ClientSession, duration: float) -> None:
        actions: list[tuple[str, Callable[[Fault], Any]]] = [
            ("idle-probe", lambda f: self.idle_probe(session, f)),
            ("member-pod-deleted", self.member_pod_deleted),
            ("router-pod-deleted", self.router_pod_deleted),
            ("reconciler-leader-killed", self.reconciler_leader_killed),
            ("apiserver-restart", self.apiserver_restart),
        ]
        gap = 2.0
        round_ = 0
        last_restart: float | None = None
        while round_ == 0 or self.now() < duration:
            for name, action in actions:
                await asyncio.sleep(gap)
                if name == "apiserver-restart" and last_restart is not None:
                    spaced = last_restart + APISERVER_RESTART_SPACING
                    if spaced > duration:
                        # A later round's restart would come after the run's end: the
                        # run would wait for it, with no other fault, for minutes.
                        continue
                    # Time passing, not a synchronisation: see APISERVER_RESTART_SPACING.
                    await asyncio.sleep(max(0.0, spaced - self.now()))
                if name == "apiserver-restart":
                    last_restart = self.now()
                fault = Fault(name, self.now())
                self.faults.append(fault)
                self.say(f"FAULT {name}")
                await action(fault)
                fault.end = self.now()
                fault.recovered_after = await self.serves_again(session)
                self.say(f"fault {name}: {fault.detail}; serving again after "
                         f"{_seconds(fault.recovered_after)}")
                if fault.recovered_after is None:
                    self.violation(f"the pool did not serve again within {RECOVERY:g}s "
                                   f"after {name}")
            round_ += 1

    async def run(self, duration: float) -> None:
        rng = random.Random(20261130)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                         trust_env=False) as session:
            background = [asyncio.create_task(self.watch()), asyncio.create_task(self.sample())]
            background += [asyncio.create_task(self.worker(session, random.Random(rng.random())))
                           for _ in range(WORKERS)]
            try:
                await self.inject(session, duration)
            finally:
                self.stop.set()
                for task in background[:2]:
                    task.cancel()
                # Workers finish their request in flight (each bounded by CLIENT_TIMEOUT).
                await asyncio.gather(*background, return_exceptions=True)


def said_by(answer: bytes) -> str:
    """The error message of a router's answer (OpenAI's `error.message`), else its start."""
    try:
        message = json.loads(answer)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return answer[:200].decode(errors="replace")
    return str(message)[:300]


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}s"


def kubectl_argv(kubectl: Kubectl, *args: str) -> list[str]:
    return [kubectl.binary, f"--kubeconfig={kubectl.kubeconfig}", *args]


# Installation


def scoped_install(kubectl: Kubectl, namespace: str) -> list[Json]:
    """modelpool from overlays/local with its reconciler scoped to `namespace`: two replicas
    electing a leader on a Lease in `namespace` (so the test can kill the leader without
    touching a cluster-wide install), plus the Role that lets them hold that Lease."""
    documents: list[Json] = []
    for doc in harness.rendered_install(kubectl):
        if doc.get("kind") == "Deployment" and doc["metadata"]["name"] == harness.RECONCILER:
            name = harness.scoped_reconciler_name(namespace)
            doc["metadata"]["name"] = name
            doc["metadata"].setdefault("labels", {})[harness.LABEL_SCOPE] = namespace
            doc["spec"]["replicas"] = RECONCILER_REPLICAS
            doc["spec"]["selector"]["matchLabels"][harness.LABEL_SCOPE] = namespace
            doc["spec"]["template"]["metadata"]["labels"][harness.LABEL_SCOPE] = namespace
            doc["spec"]["template"]["spec"]["containers"][0]["args"] = [
                "run", "--namespace", namespace, "--leader-elect",
                "--lease-namespace", namespace, "--probe-interval", "0.5",
            ]
        documents.append(doc)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "soak-leader-election", "namespace": namespace},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["create", "get", "watch", "update", "patch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "soak-leader-election", "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "soak-leader-election"},
               "subjects": [{"kind": "ServiceAccount", "name": harness.RECONCILER,
                             "namespace": harness.SYSTEM_NAMESPACE}]}
    return [*documents, role, binding]


# The soak's own cluster (it restarts kube-apiserver): overrides the shared fixture. It
# stays on the local testbed: its faults are the local processes' (kube-apiserver stopped
# and started by e2e/local, the leader's process killed, the node agent's pod files read).
TESTBED = "local"
cluster = local_fixtures.private_cluster("soak-cluster")


@pytest.fixture
def soak_system(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    cluster_wide = kubectl("get", "deployment", harness.RECONCILER, "-n",
                           harness.SYSTEM_NAMESPACE, "-o", "jsonpath={.spec.replicas}",
                           check=False)
    if cluster_wide.returncode == 0 and cluster_wide.stdout.strip() not in ("", "0"):
        pytest.fail("a cluster-wide reconciler runs (modelpool-system/modelpool-reconciler): it "
                    "would act on the soak's pool too; run the soak on a cluster of its own")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
            input=yaml.safe_dump_all(scoped_install(kubectl, namespace)), timeout=90.0)
    try:
        for plural in harness.CRDS:
            kubectl("wait", "--for=condition=Established", f"crd/{plural}.{harness.GROUP}",
                    "--timeout=60s", timeout=65.0)
        harness.eventually(
            lambda: True if len([
                p for p in harness.list_pods(kubectl, harness.SYSTEM_NAMESPACE,
                                             f"{harness.LABEL_SCOPE}={namespace}")
                if p.ready]) == RECONCILER_REPLICAS else None,
            "both reconciler replicas Ready", 90.0)
        members = [harness.fake_member(m, load_time=1.0, tokens_per_second=200.0)
                   for m in MODELS]
        harness.apply(kubectl, namespace, *members,
                      harness.pool(POOL, MODELS, default=MODELS[0],
                                   swap_budget=f"{SWAP_BUDGET:g}s"),
                      harness.router(ROUTER, MODELS, replicas=ROUTER_REPLICAS))
        harness.wait_pool_ready(kubectl, namespace, POOL, resident=MODELS[0], within=90.0)
        harness.wait_router_ready(kubectl, namespace, ROUTER, within=90.0)
        yield namespace
    finally:
        harness.uninstall_scope(kubectl, namespace)


def soak_seconds(config: pytest.Config) -> float:
    option = config.getoption("--soak-seconds", default=None)
    return float(option) if option is not None else SOAK_SECONDS


@pytest.mark.timeout(int(SOAK_SECONDS) + 600)
async def test_soak_under_faults(
    kubectl: Kubectl, cluster: controlplane.LocalCluster, soak_system: str,
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    duration = soak_seconds(request.config)
    soak = Soak(kubectl, cluster, soak_system)
    soak.say(f"soak for {duration:g}s: {WORKERS} workers over {', '.join(MODELS)}")
    await soak.run(duration)

    for outcome in soak.outcomes:
        why = judge(outcome, soak.faults, SWAP_BUDGET, REQUEST_SLACK, SELF_HEAL)
        if why is not None:
            soak.violations.append(Violation(outcome.start, why))
    codes: dict[str, int] = {}
    for outcome in soak.outcomes:
        key = str(outcome.status or outcome.error)
        codes[key] = codes.get(key, 0) + 1
    record = {
        "seconds": soak.now(),
        "requests": len(soak.outcomes),
        "by_status": codes,
        "swaps": soak.swaps,
        "faults": [asdict(f) for f in soak.faults],
        "violations": [asdict(v) for v in soak.violations],
        "process_samples": soak.samples,
        "outcomes": [asdict(o) for o in soak.outcomes],
    }
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(record, indent=1))
    soak.say(f"{len(soak.outcomes)} requests {codes}; {len(soak.swaps)} swaps; "
             f"{len(soak.faults)} faults; {soak.samples} process samples; "
             f"{len(soak.violations)} violations; record in {path}")
    for fault in soak.faults:
        soak.say(f"  {fault.name:<26} at {fault.start:7.2f}s: {fault.detail}; "
                 f"serving again after {_seconds(fault.recovered_after)}")

    assert {f.name for f in soak.faults} == {
        "idle-probe", "member-pod-deleted", "router-pod-deleted",
        "reconciler-leader-killed", "apiserver-restart"}
    assert soak.samples >= soak.now() / SAMPLE_SECONDS / 4, "the process sampler fell behind"
    assert codes.get("200", 0) > len(MODELS), codes
    assert len(soak.swaps) >= 3, soak.swaps
    assert not soak.violations, "\n".join(f"{v.at:.2f}s {v.what}" for v in soak.violations)


# The rules, by table


def _outcome(status: int | None = 200, seconds: float = 1.0, start: float = 100.0,
             retry_after: str | None = None, error: str | None = None) -> Outcome:
    return Outcome(start, start + seconds, "alpha", "127.0.0.9", status, retry_after, error)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("outcome", "faults", "broken"),
    [
        (_outcome(), [], False),
        (_outcome(503, retry_after="3"), [], False),
        (_outcome(503), [], True),
        (_outcome(200, seconds=SWAP_BUDGET + REQUEST_SLACK + 1), [], True),
        (_outcome(None, seconds=CLIENT_TIMEOUT, error="timeout"), [], True),
        (_outcome(502), [], True),
        (_outcome(502), [Fault("router", 95.0, 99.0)], False),
        (_outcome(502, start=120.0), [Fault("router", 95.0, 99.0)], True),
        (_outcome(None, error="ClientConnectorError"), [Fault("router", 99.0)], False),
        (_outcome(504, start=105.0), [Fault("api", 90.0, 100.0)], False),
    ],
)
def test_judge(outcome: Outcome, faults: list[Fault], broken: bool) -> None:
    assert (judge(outcome, faults, SWAP_BUDGET, REQUEST_SLACK, SELF_HEAL) is not None) == broken


@pytest.mark.unit
def test_processes_map_to_members() -> None:
    pods = "/state/node/pods"
    directory = f"{pods}/ns1_beta-6c7975c64c-2kngz_510070b8-a2c6"
    assert pod_of_directory(directory, pods, "ns1") == "beta-6c7975c64c-2kngz"
    assert pod_of_directory(directory, pods, "ns2") is None
    assert member_of_pod("beta-6c7975c64c-2kngz", MODELS) == "beta"
    assert member_of_pod("soak-router-6c7975c64c-2kngz", MODELS) is None


@pytest.mark.unit
def test_a_violation_says_what_the_router_said() -> None:
    said = said_by(b'{"error": {"message": "Backend \'gamma\' failed: Server disconnected"}}')
    assert said == "Backend 'gamma' failed: Server disconnected"
    assert said_by(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
    why = judge(Outcome(100.0, 101.0, "gamma", "127.0.0.9", 502, said=said), [],
                SWAP_BUDGET, REQUEST_SLACK, SELF_HEAL)
    assert why == ("status 502 outside any fault (gamma via 127.0.0.9): "
                   "Backend 'gamma' failed: Server disconnected")
