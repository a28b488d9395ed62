"""Scale benchmark: one reconciler for 10, 100 and 500 pools on fake GPU nodes.

Per size, on a fresh local control plane (`e2e.local.controlplane`, no node agent) with
KWOK playing one fake GPU node per pool (`e2e.kwok.testbed`) and one stand-in server
answering every pod's probes (`e2e.kwok.standin`):

- pools of 3 members each (ModelServers of the `llamacpp` runtime, one GPU each); every
  `--budget-every`th pool has a memory budget (`spec.gpuMemory`, two of its three members
  fit) and its own node with three GPUs, the others are exclusive;
- up to `--routers` ModelRouters, each fronting an equal share of the pools, each run as a
  router process (`python -m sidecar`) from the config the reconciler rendered for it;
- the reconciler as a process (`python -m reconciler`), scoped to the namespace.

It measures, once every pool is Ready: the reconciler's CPU and API requests while nothing
changes (`--idle` seconds), then waves of 1, 10 and 50 swaps at once (a swap is requested
by writing the pool's `status.request` as a router does), then a restart of the reconciler
and one of the API server, each followed at once by a swap request. It prints, per size:
the reconciler's CPU per swap and at idle, its resident memory, its API requests per
minute at idle by verb and per swap (counted by the reconciler itself,
`modelpool_reconciler_api_requests_total`), the swap's overhead p50 and p95 at each
concurrency and against a lone pool's (KWOK loads nothing: a swap's whole time is overhead),
the time from each restart to the first completed swap, and each router's resident memory
and watch count (the API server's `apiserver_longrunning_requests`, before and after the
routers start).

    .venv/bin/python benchmarks/bench_scale.py                      # 10, 100 and 500 pools
    .venv/bin/python benchmarks/bench_scale.py --sizes 10 --idle 20 # a smoke run
    .venv/bin/python benchmarks/bench_scale.py --json out.json      # the figures as JSON too
    .venv/bin/python benchmarks/bench_scale.py --sizes 100 --reconciler-workers 4,16
                                           # each size once per worker count, side by side
    .venv/bin/python benchmarks/bench_scale.py --sizes 500 --controller-qps 20,200
                                           # and once per client rate of the controller
                                           # manager and scheduler (theirs: 20 and 50)

Needs Go for the first build of the control plane and KWOK (cached after). Every cluster
is taken down at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e.harness import wait_established  # noqa: E402
from e2e.kwok import testbed  # noqa: E402
from e2e.kwok.standin import StandIn  # noqa: E402
from e2e.local import controlplane, processes  # noqa: E402
from e2e.local.demo import Kubectl, metric_samples  # noqa: E402
from kubecore.pool_request import next_request_ops  # noqa: E402
from reconciler import kube as k  # noqa: E402

NAMESPACE = "scale"
GROUP = "modelpool.dev/v1alpha1"
MEMBERS = 3
RECONCILER = "reconciler"
READ_VERBS = ("get", "list", "watch")
NODES = k.Resource("v1", "Node", "nodes", namespaced=False)
NAMESPACES = k.Resource("v1", "Namespace", "namespaces", namespaced=False)
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the objects ---


def member_name(pool: int, member: int) -> str:
    return f"p{pool:04d}-m{member}"


def pool_name(pool: int) -> str:
    return f"p{pool:04d}"


def budgeted(pool: int, every: int) -> bool:
    return every > 0 and pool % every == every - 1


# Exclusive pools' members go to the one-GPU nodes, a budgeted pool's to its own node.
KIND_LABEL = "modelpool.dev/scale-node"


def model_server(pool: int, member: int, port: int, pinned: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "runtime": "llamacpp",
        "image": "modelpool/stand-in:scale",
        "model": f"/models/{member_name(pool, member)}.gguf",
        "port": port,
        "resources": {"gpu": 1, "gpuMemory": "20Gi"},
    }
    spec["nodeSelector"] = ({"kubernetes.io/hostname": pinned} if pinned
                            else {KIND_LABEL: "exclusive"})
    return {"apiVersion": GROUP, "kind": "ModelServer",
            "metadata": {"name": member_name(pool, member), "namespace": NAMESPACE},
            "spec": spec}


def model_pool(pool: int, budget: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "members": [{"name": member_name(pool, m)} for m in range(MEMBERS)],
        "default": member_name(pool, 0),
        "swapBudget": "120s",
    }
    if budget:
        spec["gpuMemory"] = "48Gi"
    return {"apiVersion": GROUP, "kind": "ModelPool",
            "metadata": {"name": pool_name(pool), "namespace": NAMESPACE}, "spec": spec}


def model_router(index: int, pools: Sequence[int]) -> dict[str, Any]:
    backends = [{"name": member_name(p, m), "modelServerRef": {"name": member_name(p, m)}}
                for p in pools for m in range(MEMBERS)]
    return {"apiVersion": GROUP, "kind": "ModelRouter",
            "metadata": {"name": f"r{index:02d}", "namespace": NAMESPACE},
            "spec": {"backends": backends, "defaultRoute": backends[0]["name"],
                     "proxy": {"image": "modelpool/router:scale"}}}


def shares(pools: int, routers: int) -> list[list[int]]:
    """The pools each router fronts: an equal share each, every pool fronted once."""
    return [[p for p in range(pools) if p % routers == r] for r in range(routers)]


# --- measuring a process ---


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all but idle and iowait) since boot."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def by_call(samples: Mapping[tuple[tuple[str, str], ...], float]) -> dict[str, float]:
    """Request counts by "verb resource"."""
    return {f"{dict(labels).get('verb', '?')} {dict(labels).get('resource', '?')}": value
            for labels, value in samples.items()}


def by_verb(calls: Mapping[str, float]) -> dict[str, float]:
    verbs: dict[str, float] = {}
    for call, value in calls.items():
        verb = call.split(" ", 1)[0]
        verbs[verb] = verbs.get(verb, 0.0) + value
    return verbs


def minus(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {v: after.get(v, 0.0) - before.get(v, 0.0) for v in sorted(set(after) | set(before))
            if after.get(v, 0.0) - before.get(v, 0.0)}


def writes_of(calls: Mapping[str, float]) -> float:
    return sum(n for c, n in calls.items() if c.split(" ", 1)[0] not in READ_VERBS)


# --- results ---


@dataclass
class Wave:
    concurrency: int
    seconds: list[float] = field(default_factory=list)
    cpu: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)
    routers_cpu: float = 0.0  # all routers together
    # the reconciler's seconds per swap phase, summed over the wave's swaps
    phases: dict[str, float] = field(default_factory=dict)
    failed: int = 0
    # CPU seconds each process of the testbed spent during the wave, and the machine's
    # busy seconds and wall seconds (its saturation)
    components: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    wall: float = 0.0


@dataclass
class SizeResult:
    pools: int
    budgeted: int
    routers: int
    workers: int | None = None  # the reconciler's --workers (None: its default)
    # The controller manager's and scheduler's --kube-api-qps (None: their default, 20 and 50).
    api_qps: int | None = None
    setup_seconds: float = 0.0
    idle_seconds: float = 0.0
    idle_cpu_share: float = 0.0
    idle_requests_per_minute: dict[str, float] = field(default_factory=dict)
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    waves: list[Wave] = field(default_factory=list)
    budget_waves: list[Wave] = field(default_factory=list)
    reconciler_restart_to_swap: float = float("nan")
    apiserver_restart_to_swap: float = float("nan")
    apiserver_down_seconds: float = float("nan")
    router_rss_mb: list[float] = field(default_factory=list)
    router_watches: dict[str, float] = field(default_factory=dict)
    reconciler_watches: dict[str, float] = field(default_factory=dict)
    probes_per_pod: float = 0.0
    scrape_cpu: float = 0.0  # the reconciler's CPU seconds for one scrape of its /metrics
    # the waits each control-plane client logged for its own client-side rate limit
    throttled: dict[str, int] = field(default_factory=dict)


# --- the run ---


class Bench:
    def __init__(self, args: argparse.Namespace, pools: int, root: Path,
                 workers: int | None = None, api_qps: int | None = None) -> None:
        self.args = args
        self.pools = pools
        self.workers = workers  # the reconciler's --workers (None: its default)
        self.api_qps = api_qps
        self.root = root
        self.routers = min(args.routers, pools)
        self.budget_pools = [p for p in range(pools) if budgeted(p, args.budget_every)]
        self.result = SizeResult(pools, len(self.budget_pools), self.routers, workers=workers,
                                 api_qps=api_qps)
        self.cluster: controlplane.LocalCluster | None = None
        self.kube: k.Kube | None = None
        self.standin = StandIn()
        self.metrics_port = 0
        self.profiled = False
        self.router_pids: list[int] = []
        self.pool_cache: k.Informer | None = None
        self.changed = asyncio.Event()

    # cluster

    def up(self) -> controlplane.LocalCluster:
        return controlplane.up(controlplane.UpOptions(
            state_dir=self.root / "cluster", python=sys.executable, with_node=False,
            bin_dir=self.cluster.bin_dir if self.cluster else None, timeout=300.0,
            api_qps=self.api_qps))

    @property
    def kubectl(self) -> Kubectl:
        assert self.cluster is not None
        return Kubectl(self.cluster.kubeconfig, str(self.cluster.bin_dir / "kubectl"))

    async def each(self, bodies: Sequence[dict[str, Any]],
                   call: Callable[[dict[str, Any]], Any], width: int = 16) -> None:
        gate = asyncio.Semaphore(width)

        async def one(body: dict[str, Any]) -> None:
            async with gate:
                for attempt in range(5):
                    try:
                        await call(body)
                        return
                    except k.KubeError:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(1.0)

        await asyncio.gather(*(one(b) for b in bodies))

    async def setup(self) -> None:
        started = time.monotonic()
        self.cluster = await asyncio.to_thread(self.up)
        kwok = testbed.Kwok(self.cluster, await asyncio.to_thread(testbed.build))
        kwok.start()
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                     str(REPO / "manifests" / "crds"))
        wait_established(self.kubectl, [f"{p}.modelpool.dev" for p in
                                        ("modelservers", "modelpools", "modelrouters")])
        self.kube = await k.Kube.connect(str(self.cluster.kubeconfig))
        kube = self.kube
        port = await self.standin.start()
        budget = set(self.budget_pools)
        nodes = [testbed.node(p, gpus=MEMBERS if p in budget else 1,
                              labels={KIND_LABEL: "budget" if p in budget else "exclusive"})
                 for p in range(self.pools)]
        await self.each(nodes, lambda n: kube.create(NODES, None, n))
        await kube.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": NAMESPACE}})
        servers = [model_server(p, m, port, testbed.node_name(p) if p in budget else None)
                   for p in range(self.pools) for m in range(MEMBERS)]
        await self.each(servers, kube.apply)
        await self.each([model_pool(p, p in budget) for p in range(self.pools)], kube.apply)
        await self.each([model_router(r, s) for r, s in
                         enumerate(shares(self.pools, self.routers))], kube.apply)
        self.pool_cache = k.Informer(kube, k.MODEL_POOLS, NAMESPACE,
                                     lambda _t, _o: self.changed.set())
        asyncio.get_running_loop().create_task(self.pool_cache.run())
        await self.start_reconciler()
        await self.until(lambda: self.all_ready(), "every pool Ready", 900)
        self.result.setup_seconds = time.monotonic() - started
        log(f"{self.pools} pools Ready after {self.result.setup_seconds:.0f}s")

    # the reconciler

    async def start_reconciler(self) -> int:
        assert self.cluster is not None
        self.metrics_port = free_port()
        layout = self.cluster.layout
        profile: list[str] = []
        if self.args.profile is not None and not self.profiled:
            # the first run of the reconciler, to its SIGTERM: setup, idle and the swaps
            self.profiled = True
            profile = ["-m", "cProfile", "-o", str(self.args.profile.resolve()
                                                   / f"reconciler-{self.pools}.prof")]
        workers = [] if self.workers is None else [f"--workers={self.workers}"]
        return processes.start(
            [sys.executable, *profile, "-m", "reconciler", "--namespace", NAMESPACE,
             f"--kubeconfig={self.cluster.kubeconfig}", f"--metrics-port={self.metrics_port}",
             "--log-level=WARNING", *workers],
            layout.pid(RECONCILER), layout.log(RECONCILER),
            env={**os.environ, "MODELPOOL_BIND_HOST": "127.0.0.1"}, cwd=REPO)

    @property
    def reconciler_pid(self) -> int:
        assert self.cluster is not None
        pid = processes.running(self.cluster.layout.pid(RECONCILER))
        if pid is None:
            raise RuntimeError(f"the reconciler is not running: see "
                               f"{self.cluster.layout.log(RECONCILER)}")
        return pid

    async def reconciler_requests(self) -> dict[str, float]:
        return (await self.scrape())[0]

    async def scrape(self) -> tuple[dict[str, float], dict[str, float]]:
        """The reconciler's requests by call, and its seconds per swap phase (all pools)."""
        text = await get_text(f"http://127.0.0.1:{self.metrics_port}/metrics")
        phases: dict[str, float] = {}
        for labels, value in metric_samples(
                text, "modelpool_swap_phase_duration_seconds_sum").items():
            phase = dict(labels).get("phase", "?")
            phases[phase] = phases.get(phase, 0.0) + value
        return by_call(metric_samples(text, "modelpool_reconciler_api_requests_total")), phases

    # pools

    def status(self, pool: int) -> dict[str, Any]:
        assert self.pool_cache is not None
        body = self.pool_cache.get(NAMESPACE, pool_name(pool)) or {}
        return body.get("status") or {}

    def all_ready(self) -> bool:
        return all(self.status(p).get("phase") == "Ready" for p in range(self.pools))

    async def until(self, check: Callable[[], bool], what: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not check():
            self.changed.clear()
            if check():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))

    def target(self, pool: int) -> str:
        """A member the pool does not hold: the next one after its resident."""
        status = self.status(pool)
        held = set((status.get("residentMembers") or "").split(",")) | {
            status.get("residentMember")}
        for step in range(1, MEMBERS + 1):
            index = (int((status.get("residentMember") or "m0").rsplit("m", 1)[1]) + step) \
                % MEMBERS
            name = member_name(pool, index)
            if name not in held:
                return name
        return member_name(pool, 0)

    async def request(self, pool: int, member: str) -> int:
        """Write the pool's request as a router does (compare-and-swap); its generation."""
        assert self.kube is not None
        for _ in range(50):
            try:
                body = await self.kube.request("GET", k.MODEL_POOLS, NAMESPACE, pool_name(pool))
                ops = next_request_ops(body.get("status"), body["metadata"]["resourceVersion"],
                                       {"member": member,
                                        "requestedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime()),
                                        "requestedBy": f"{NAMESPACE}/bench/bench"})
                result = await self.kube.json_patch_status(k.MODEL_POOLS, NAMESPACE,
                                                           pool_name(pool), ops)
                return int(result["status"]["request"]["generation"])
            except k.Conflict:
                await asyncio.sleep(0.05)
            except k.KubeError:
                await asyncio.sleep(0.5)  # the API server is restarting
        raise RuntimeError(f"could not write the request of {pool_name(pool)}")

    def swapped(self, pool: int, generation: int) -> bool:
        last = self.status(pool).get("lastSwap") or {}
        return isinstance(last.get("generation"), int) and last["generation"] >= generation

    async def swap(self, pool: int, within: float = 180.0) -> float:
        """Request a swap of `pool` and wait until it completes; its seconds."""
        started = time.monotonic()
        generation = await self.request(pool, self.target(pool))
        await self.until(lambda: self.swapped(pool, generation),
                         f"the swap of {pool_name(pool)}", within)
        outcome = (self.status(pool).get("lastSwap") or {}).get("outcome")
        if outcome != "Succeeded":
            raise RuntimeError(f"the swap of {pool_name(pool)} ended {outcome}")
        return time.monotonic() - started

    async def wave(self, pools: Sequence[int]) -> Wave:
        wave = Wave(len(pools))
        pid = self.reconciler_pid
        # the scrapes of /metrics stay out of the CPU measured (`scrape_cpu` is theirs)
        requests, phases = await self.scrape()
        cpu, routers_cpu = cpu_seconds(pid), self.routers_cpu()
        components, busy, started = self.components_cpu(), machine_busy_seconds(), \
            time.monotonic()
        results = await asyncio.gather(*(self.swap(p) for p in pools), return_exceptions=True)
        wave.wall = time.monotonic() - started
        wave.machine_busy = machine_busy_seconds() - busy
        wave.components = minus(self.components_cpu(), components)
        await asyncio.sleep(1.0)  # the status writes that follow a swap's completion
        wave.cpu = cpu_seconds(pid) - cpu
        wave.routers_cpu = self.routers_cpu() - routers_cpu
        requests_after, phases_after = await self.scrape()
        wave.requests = minus(requests_after, requests)
        wave.phases = minus(phases_after, phases)
        for r in results:
            if isinstance(r, BaseException):
                wave.failed += 1
                log(f"  a swap failed: {r}")
            else:
                wave.seconds.append(r)
        return wave

    # phases

    async def idle(self) -> None:
        await asyncio.sleep(self.args.settle)
        pid = self.reconciler_pid
        before = cpu_seconds(pid)
        requests = await self.reconciler_requests()
        r = self.result
        r.scrape_cpu = cpu_seconds(pid) - before  # one scrape of /metrics (all samples)
        cpu, started = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(self.args.idle)
        elapsed = time.monotonic() - started
        r.idle_seconds = elapsed
        r.idle_cpu_share = (cpu_seconds(pid) - cpu) / elapsed
        r.idle_requests_per_minute = {
            v: n * 60 / elapsed for v, n in minus(await self.reconciler_requests(),
                                                  requests).items()}
        r.rss_mb = rss_mb(pid)
        log(f"idle: {r.idle_cpu_share * 100:.1f}% of a core, {r.rss_mb:.0f} MB, "
            f"requests/min {r.idle_requests_per_minute}")

    async def swaps(self) -> None:
        exclusive = [p for p in range(self.pools) if p not in set(self.budget_pools)]
        cursor = 0
        # a level above the exclusive pools' count swaps them all at once
        levels = sorted({min(c, len(exclusive)) for c in self.args.concurrency} - {0})
        for concurrency in levels:
            waves = self.args.lone_waves if concurrency == 1 else self.args.waves
            for _ in range(waves):
                chosen = [exclusive[(cursor + i) % len(exclusive)] for i in range(concurrency)]
                cursor += concurrency
                wave = await self.wave(chosen)
                self.result.waves.append(wave)
                log(f"wave of {concurrency}: p50 {quantile(wave.seconds, 0.5):.2f}s "
                    f"p95 {quantile(wave.seconds, 0.95):.2f}s cpu {wave.cpu:.2f}s "
                    f"phases {fmt_verbs(wave.phases)} requests {wave.requests}")
        if self.budget_pools:
            for concurrency in sorted({1, min(10, len(self.budget_pools))}):
                wave = await self.wave(self.budget_pools[:concurrency])
                self.result.budget_waves.append(wave)
                log(f"budgeted wave of {concurrency}: p95 {quantile(wave.seconds, 0.95):.2f}s")

    async def restart_reconciler(self) -> None:
        assert self.cluster is not None
        processes.stop(self.cluster.layout.pid(RECONCILER), 30.0)
        started = time.monotonic()
        await self.start_reconciler()
        await self.swap(0, within=300)
        self.result.reconciler_restart_to_swap = time.monotonic() - started
        log(f"reconciler restart to a completed swap: "
            f"{self.result.reconciler_restart_to_swap:.1f}s")

    async def restart_apiserver(self) -> None:
        assert self.cluster is not None
        started = time.monotonic()
        processes.stop(self.cluster.layout.pid("kube-apiserver"), 10.0)
        up = asyncio.get_running_loop().create_task(asyncio.to_thread(self.up))
        swap = asyncio.get_running_loop().create_task(self.swap(1 % self.pools, within=300))
        await up
        self.result.apiserver_down_seconds = time.monotonic() - started
        await swap
        self.result.apiserver_restart_to_swap = time.monotonic() - started
        log(f"API server restart to a completed swap: "
            f"{self.result.apiserver_restart_to_swap:.1f}s "
            f"(stopped and serving again after {self.result.apiserver_down_seconds:.1f}s)")

    async def watches(self) -> dict[str, float]:
        text = (await asyncio.to_thread(self.kubectl, "get", "--raw", "/metrics")).stdout
        found: dict[str, float] = {}
        for labels, value in metric_samples(text, "apiserver_longrunning_requests").items():
            got = dict(labels)
            if got.get("verb") == "WATCH" and value:
                resource = got.get("resource", "?")
                found[resource] = found.get(resource, 0.0) + value
        return found

    async def start_routers(self) -> None:
        assert self.cluster is not None and self.kube is not None
        before = await self.watches()
        configs = self.root / "routers"
        configs.mkdir(exist_ok=True)
        ready = []
        for r in range(self.routers):
            name = f"r{r:02d}"
            cm = await self.rendered_config(name)
            path = configs / f"{name}.json"
            path.write_text(cm["data"]["config.json"])
            metrics = free_port()
            self.router_pids.append(processes.start(
                [sys.executable, "-m", "sidecar", f"--config={path}",
                 f"--kubeconfig={self.cluster.kubeconfig}", "--host=127.0.0.1",
                 f"--port={free_port()}", f"--metrics-port={metrics}", "--log-level=WARNING"],
                configs / f"{name}.pid", configs / f"{name}.log",
                env={**os.environ, "POD_NAME": name}, cwd=REPO))
            ready.append(metrics)
        for metrics in ready:
            await until_ok(f"http://127.0.0.1:{metrics}/readyz", 300)
        after = await self.watches()
        self.result.router_watches = {r: n / self.routers for r, n in
                                      minus(after, before).items()}
        log(f"{self.routers} routers ready; watches per router {self.result.router_watches}")

    def throttled(self) -> dict[str, int]:
        assert self.cluster is not None
        found = {}
        for name in ("kube-controller-manager", "kube-scheduler", testbed.KWOK):
            with contextlib.suppress(OSError):
                text = self.cluster.layout.log(name).read_text(errors="replace")
                found[name] = text.count("client-side throttling")
        return found

    async def rendered_config(self, router: str, within: float = 600.0) -> dict[str, Any]:
        """The ConfigMap the reconciler rendered for `router`, once it has (the routers'
        reconciles come after the pools' and servers' at the start)."""
        assert self.kube is not None
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            cm = await self.kube.get(k.CONFIG_MAPS, NAMESPACE, f"{router}-config")
            if cm is not None:
                return cm
            await asyncio.sleep(1.0)
        raise RuntimeError(f"the reconciler rendered no ConfigMap for router {router}")

    def routers_cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.router_pids)

    def components_cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process of the testbed: the control plane, KWOK, the
        reconciler, the routers together, and this process (the stand-in and the driver)."""
        assert self.cluster is not None
        found = {"reconciler": cpu_seconds(self.reconciler_pid),
                 "routers": self.routers_cpu(), "bench and stand-in": cpu_seconds(os.getpid())}
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                     testbed.KWOK):
            running = processes.running(self.cluster.layout.pid(name))
            if running is not None:
                with contextlib.suppress(OSError):
                    found[name] = cpu_seconds(running)
        return found

    def router_memory(self) -> None:
        self.result.router_rss_mb = [rss_mb(pid) for pid in self.router_pids]

    async def run(self) -> SizeResult:
        try:
            await self.setup()
            self.result.reconciler_watches = {
                c.split(" ", 1)[1]: n for c, n in (await self.reconciler_requests()).items()
                if c.startswith("watch ")}
            await self.start_routers()
            await self.idle()
            await self.swaps()
            self.router_memory()
            self.result.throttled = self.throttled()
            self.result.peak_rss_mb = rss_mb(self.reconciler_pid, "VmHWM")
            await self.restart_reconciler()
            await self.restart_apiserver()
            running = [n for n in self.standin.requests.values() if n]
            self.result.probes_per_pod = statistics.mean(running) if running else 0.0
            return self.result
        finally:
            await self.teardown()

    async def teardown(self) -> None:
        for pid in self.router_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)
        if self.pool_cache is not None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task() and not task.done():
                    task.cancel()
        if self.kube is not None:
            await self.kube.close()
        await self.standin.stop()
        if self.cluster is not None and self.cluster.layout.pid(RECONCILER).exists():
            processes.stop(self.cluster.layout.pid(RECONCILER), 10.0)
        if not self.args.keep:
            await asyncio.to_thread(controlplane.down, self.root / "cluster")
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            log(f"kept: {self.root}")


# --- helpers ---


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def get_text(url: str) -> str:
    # a scrape of the reconciler's /metrics at 500 pools took more than 10 s on a loaded
    # 2-core machine (about 126 samples a pool)
    async with aiohttp.ClientSession() as session, session.get(
            url, timeout=aiohttp.ClientTimeout(total=120)) as response:
        return await response.text()


async def until_ok(url: str, within: float) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} not ready within {within:.0f}s")


# --- the report ---


def per_swap(waves: Sequence[Wave]) -> tuple[float, dict[str, float]]:
    swaps = sum(len(w.seconds) for w in waves) or 1
    requests: dict[str, float] = {}
    for w in waves:
        for verb, n in w.requests.items():
            requests[verb] = requests.get(verb, 0.0) + n
    return sum(w.cpu for w in waves) / swaps, {v: n / swaps for v, n in requests.items()}


def swaps_of(waves: Sequence[Wave]) -> int:
    return sum(len(w.seconds) for w in waves)


def by_concurrency(waves: Sequence[Wave]) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for w in waves:
        found.setdefault(w.concurrency, []).extend(w.seconds)
    return found


def fmt_verbs(verbs: Mapping[str, float]) -> str:
    return ", ".join(f"{v} {n:.1f}" for v, n in sorted(verbs.items())) or "none"


def report(results: Sequence[SizeResult]) -> str:
    lines = [f"machine: {os.cpu_count()} cores, {platform.machine()}, "
             f"{platform.python_implementation()} {platform.python_version()}", ""]
    for r in results:
        cpu, requests = per_swap(r.waves)
        seconds = by_concurrency(r.waves)
        lone = seconds.get(1, [])
        lone_p95 = quantile(lone, 0.95)
        rss = r.router_rss_mb or [float("nan")]
        lines += [
            f"== {r.pools} pools ({r.budgeted} with a memory budget), {r.routers} routers"
            + ("" if r.workers is None else f", reconciler on {r.workers} workers")
            + ("" if r.api_qps is None else f", controllers' client at {r.api_qps} QPS") + " ==",
            f"setup to all Ready: {r.setup_seconds:.0f}s",
            f"reconciler idle: {r.idle_cpu_share * 100:.2f}% of a core; "
            f"RSS {r.rss_mb:.0f} MB (peak {r.peak_rss_mb:.0f} MB)",
            f"one scrape of the reconciler's /metrics: {r.scrape_cpu * 1000:.0f} ms of CPU",
            f"API requests/min at idle: {fmt_verbs(by_verb(r.idle_requests_per_minute))} "
            f"(writes {writes_of(r.idle_requests_per_minute):.1f})",
            f"per swap: CPU {cpu * 1000:.0f} ms; requests {fmt_verbs(by_verb(requests))}",
            f"  by resource: {fmt_verbs(requests)}",
            f"  all routers' CPU per swap: "
            f"{sum(w.routers_cpu for w in r.waves) / max(1, swaps_of(r.waves)) * 1000:.0f} ms",
        ]
        for c, values in sorted(seconds.items()):
            waves = [w for w in r.waves if w.concurrency == c]
            phases: dict[str, float] = {}
            for w in waves:
                for phase, total in w.phases.items():
                    phases[phase] = phases.get(phase, 0.0) + total / max(1, len(values))
            wave_cpu = sum(w.cpu for w in waves)
            wave_time = sum(max(w.seconds, default=0.0) for w in waves) or 1.0
            lines.append(
                f"  {c:>3} at once: n={len(values)} p50 {quantile(values, 0.5):.2f}s "
                f"p95 {quantile(values, 0.95):.2f}s (x{quantile(values, 0.95) / lone_p95:.2f} "
                f"the lone p95); reconciler {wave_cpu / wave_time * 100:.0f}% of a core "
                f"while swapping; failed {sum(w.failed for w in waves)}; mean phases "
                f"{fmt_verbs(phases)}")
            walls = sum(w.wall for w in waves)
            if walls > 0:
                spent: dict[str, float] = {}
                for w in waves:
                    for name, seconds_ in w.components.items():
                        spent[name] = spent.get(name, 0.0) + seconds_ / max(1, len(values))
                lines.append(
                    f"      machine {sum(w.machine_busy for w in waves) / walls:.2f} of "
                    f"{os.cpu_count()} cores busy; CPU ms per swap: "
                    + ", ".join(f"{n} {v * 1000:.0f}" for n, v in
                                sorted(spent.items(), key=lambda kv: -kv[1])))
        for w in r.budget_waves:
            lines.append(f"  budgeted, {w.concurrency} at once: p50 "
                         f"{quantile(w.seconds, 0.5):.2f}s p95 {quantile(w.seconds, 0.95):.2f}s "
                         f"failed {w.failed}")
        lines += [
            f"restart of the reconciler to a completed swap: "
            f"{r.reconciler_restart_to_swap:.1f}s",
            f"restart of the API server to a completed swap: "
            f"{r.apiserver_restart_to_swap:.1f}s (stopped and serving again after "
            f"{r.apiserver_down_seconds:.1f}s: "
            f"{r.apiserver_restart_to_swap - r.apiserver_down_seconds:.1f}s once it serves)",
            f"routers: RSS min {min(rss):.0f} / median {statistics.median(rss):.0f} / max "
            f"{max(rss):.0f} MB; watches per router {fmt_verbs(r.router_watches)}",
            f"reconciler watches: {fmt_verbs(r.reconciler_watches)}",
            f"stand-in: {r.probes_per_pod:.1f} requests per probed pod address",
            f"client-side throttling logged: {fmt_verbs(r.throttled)}",
            "",
        ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10,100,500", help="pool counts, comma-separated")
    p.add_argument("--routers", type=int, default=50, help="router processes (at most pools)")
    p.add_argument("--budget-every", type=int, default=10,
                   help="every Nth pool has a memory budget (0: none)")
    p.add_argument("--concurrency", default="1,10,50", help="swaps at once, comma-separated")
    p.add_argument("--waves", type=int, default=3, help="waves per concurrency above 1")
    p.add_argument("--lone-waves", type=int, default=8, help="waves of a lone swap")
    p.add_argument("--reconciler-workers", default="",
                   help="the reconciler's --workers, comma-separated: each size is run once "
                        "with each (default: the reconciler's own default)")
    p.add_argument("--controller-qps", default="",
                   help="the controller manager's and scheduler's --kube-api-qps, "
                        "comma-separated: each size is run once with each (default: theirs, "
                        "20 and 50)")
    p.add_argument("--idle", type=float, default=60.0, help="seconds measured at idle")
    p.add_argument("--settle", type=float, default=15.0,
                   help="seconds waited before the idle window")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--profile", type=Path, default=None,
                   help="run the reconciler under cProfile until its restart; the profile "
                        "goes to this directory")
    p.add_argument("--keep", action="store_true", help="leave the clusters running")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    args.concurrency = [int(c) for c in str(args.concurrency).split(",")]
    args.reconciler_workers = [int(w) for w in str(args.reconciler_workers).split(",") if w]
    args.controller_qps = [int(q) for q in str(args.controller_qps).split(",") if q]
    return args


async def main_async(args: argparse.Namespace) -> list[SizeResult]:
    results = []
    for size in args.sizes:
        for workers in args.reconciler_workers or [None]:
            for qps in args.controller_qps or [None]:
                root = Path(tempfile.mkdtemp(prefix=f"modelpool-scale-{size}-"))
                log(f"--- {size} pools in {root}"
                    + ("" if workers is None else f", the reconciler on {workers} workers")
                    + ("" if qps is None else f", the controllers' client at {qps} QPS"))
                results.append(await Bench(args, size, root, workers, qps).run())
                print(report(results[-1:]), flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(main_async(args))
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
