"""`modelpool-local demo`: the whole system on this machine, in one command, narrated.

What a newcomer runs first. It brings the local cluster up (as `modelpool-local up`
does), installs modelpool from `overlays/local` and the pool of `examples/` exactly as a
user would (`kubectl apply --server-side -k`), and narrates:

0. the example pool cold-loading its default member while everything becomes Ready;

then sends a short script of requests through the router with the `openai` SDK:

1. a request for the resident model: served at once;
2. a request for the other member: held by the router while the pool swaps;
3. several concurrent requests for the first member again: all held, one swap, one load.

A live timeline follows along: the pool's phase, resident member and swap phases (a
watch on the ModelPool), the member pods (a watch), the requests the router holds (its
`/metrics`), and after each swap its phases' durations (the reconciler's `/metrics`) and
`status.lastSwap`. The system keeps running afterwards; the router's address and a `curl`
line are printed last, and `modelpool-local down` stops it all.

The reconciler it installs watches every namespace: run the demo on a cluster of its own
(`--state-dir`), not on one that tests with their own reconcilers share.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from e2e import harness
from e2e.local import controlplane

if TYPE_CHECKING:
    import openai

Json = dict[str, Any]

BURST = 4  # concurrent requests in the coalescing step
REQUEST_TIMEOUT = 300.0
METRICS_INTERVAL = 0.2
PROMPT = "Say hello in five words."


class DemoError(Exception):
    """The demo could not go on; the message says what to look at."""


class Kubectl:
    """kubectl against the demo's cluster (the shape `e2e.harness` expects)."""

    def __init__(self, kubeconfig: Path, binary: str) -> None:
        self.kubeconfig = kubeconfig
        self.binary = binary

    def argv(self, *args: str) -> list[str]:
        return [self.binary, f"--kubeconfig={self.kubeconfig}", *args]

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self.argv(*args), input=input, capture_output=True, text=True, timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)


# What the examples name


@dataclass(frozen=True)
class Example:
    namespace: str
    pool: str
    members: tuple[str, ...]
    default: str
    router: str


def example_names(documents: Sequence[Mapping[str, Any]]) -> Example:
    """The namespace, pool, members and router that `examples/` defines."""
    pools = [d for d in documents if d.get("kind") == "ModelPool"]
    routers = [d for d in documents if d.get("kind") == "ModelRouter"]
    if len(pools) != 1 or len(routers) != 1:
        raise DemoError("examples/ must hold exactly one ModelPool and one ModelRouter")
    pool, router = pools[0], routers[0]
    members = tuple(str(m["name"]) for m in pool["spec"]["members"])
    return Example(
        namespace=str(pool["metadata"]["namespace"]),
        pool=str(pool["metadata"]["name"]),
        members=members,
        default=str(pool["spec"].get("default") or members[0]),
        router=str(router["metadata"]["name"]),
    )


# The timeline


class Timeline:
    """Prints one line per event: wall clock, seconds since the start, who, what."""

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self.start = clock()

    def say(self, who: str, text: str) -> None:
        wall = dt.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        print(f"{wall} +{self.clock() - self.start:6.2f}s  {who:<9} {text}", file=self.out,
              flush=True)

    def heading(self, text: str) -> None:
        print(f"\n== {text}", file=self.out, flush=True)


@dataclass(frozen=True)
class PoolView:
    """What a person wants to see of a ModelPool's status."""

    phase: str = "-"
    resident: str | None = None
    swap: tuple[str, str, str] | None = None  # from, to, phase
    request: tuple[str | None, int] | None = None  # member, generation
    last_swap: Json = field(default_factory=dict)
    # Why the swap cannot go on (the Ready condition's message while the scheduler will
    # not place the target), else None.
    unschedulable: str | None = None


def unschedulable_message(obj: Mapping[str, Any]) -> str | None:
    """The pool's word on a member the scheduler will not place, if it says so."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("reason") == "Unschedulable":
            return str(c.get("message") or "")
    return None


def pool_view(obj: Mapping[str, Any]) -> PoolView:
    status = obj.get("status") or {}
    swap = status.get("swap")
    request = status.get("request")
    return PoolView(
        unschedulable=unschedulable_message(obj),
        phase=str(status.get("phase") or "-"),
        resident=status.get("residentMember"),
        swap=(str(swap.get("from") or "(none)"), str(swap.get("to")), str(swap.get("phase")))
        if swap else None,
        request=(request.get("member"), int(request.get("generation") or 0))
        if request else None,
        last_swap=dict(status.get("lastSwap") or {}),
    )


def describe_pool_change(old: PoolView, new: PoolView, phase_seconds: float | None) -> list[str]:
    """Lines describing how the pool changed; `phase_seconds` is how long the swap phase
    that just ended lasted (as this watch saw it), when one ended."""
    lines: list[str] = []
    if new.request != old.request and new.request is not None:
        member, generation = new.request
        if member is None:
            lines.append(f"request #{generation} withdrawn or cleared")
        else:
            lines.append(f"a router asks for {member} (request #{generation})")
    if new.swap != old.swap:
        ended = f" ({old.swap[2]} took {phase_seconds:.2f}s)" if old.swap and phase_seconds \
            is not None else ""
        if new.swap is not None:
            source, target, phase = new.swap
            lines.append(f"swap {source} -> {target}: {phase}{ended}")
        elif old.swap is not None:
            lines.append(f"swap {old.swap[0]} -> {old.swap[1]} ended{ended}")
    if (new.phase, new.resident) != (old.phase, old.resident):
        lines.append(f"phase {new.phase}, resident {new.resident or '(none)'}")
    if new.unschedulable is not None and new.unschedulable != old.unschedulable:
        lines.append(f"Unschedulable: {new.unschedulable}")
    if new.last_swap != old.last_swap and new.last_swap:
        last = new.last_swap
        reason = f" ({last.get('reason')}: {last.get('message')})" if last.get("reason") else ""
        lines.append(
            f"lastSwap {last.get('from') or '(none)'} -> {last.get('to')}: "
            f"{last.get('outcome')} in {float(last.get('durationSeconds') or 0):.2f}s{reason}"
        )
    return lines


def describe_pod(obj: Mapping[str, Any], deleted: bool) -> str:
    pod = harness.pod_from(dict(obj))
    if deleted:
        state = "gone (GPU free)"
    elif pod.terminating:
        state = "terminating"
    elif pod.ready:
        state = f"Ready at {pod.ip}"
    else:
        state = pod.phase + (f" at {pod.ip}" if pod.ip else "")
    return f"{pod.name}: {state}"


# Prometheus text


def metric_samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of one metric (a sample name, e.g. `x_sum`): labels -> value."""
    samples: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                samples[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def phase_seconds(text: str, namespace: str, pool: str) -> dict[str, float]:
    """The reconciler's total seconds spent per swap phase for one pool."""
    totals: dict[str, float] = {}
    for labels, value in metric_samples(text, "modelpool_swap_phase_duration_seconds_sum").items():
        d = dict(labels)
        if d.get("namespace") == namespace and d.get("pool") == pool:
            totals[d.get("phase", "?")] = value
    return totals


def held_by_member(text: str) -> dict[str, int]:
    return {
        dict(labels).get("member", "?"): int(value)
        for labels, value in metric_samples(text, "modelpool_held_requests").items()
    }


def counter_total(text: str, name: str) -> float:
    return sum(metric_samples(text, name).values())


# Watches


async def follow(argv: Sequence[str], on_event: Callable[[Json], None]) -> None:
    """Run a `kubectl get --watch -o json --output-watch-events` and feed each event."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert process.stdout is not None
    buffer = ""
    try:
        while chunk := await process.stdout.read(65536):
            events, buffer = harness.split_json_stream(buffer + chunk.decode())
            for event in events:
                on_event(event)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await process.wait()


class Narrator:
    """Follows the pool, its member pods and the router's held requests; prints changes."""

    def __init__(self, timeline: Timeline, kubectl: Kubectl, example: Example) -> None:
        self.timeline = timeline
        self.kubectl = kubectl
        self.example = example
        self.pool = PoolView()
        self.swap_phase_since = timeline.clock()
        self.held: dict[str, int] = {}
        self.pods: dict[str, str] = {}
        self.router_metrics_url: str | None = None
        self.changed = asyncio.Event()

    def on_pool(self, event: Json) -> None:
        new = pool_view(event["object"])
        if self.pool.phase == "-":
            # The first event is the state so far: an old request or last swap is no news
            # (a swap in progress is).
            self.pool = PoolView(request=new.request, last_swap=new.last_swap)
        now = self.timeline.clock()
        lasted = now - self.swap_phase_since if self.pool.swap else None
        if new.swap != self.pool.swap:
            self.swap_phase_since = now
        for line in describe_pool_change(self.pool, new, lasted):
            self.timeline.say("pool", line)
        self.pool = new
        self.changed.set()

    def on_pod(self, event: Json) -> None:
        line = describe_pod(event["object"], event.get("type") == "DELETED")
        name = line.split(":", 1)[0]
        if self.pods.get(name) != line:
            self.pods[name] = line
            self.timeline.say("pod", line)

    async def watch_pool(self) -> None:
        # A watch of the list, so it may start before the pool exists.
        await follow(self.kubectl.argv(
            "get", f"modelpools.{harness.GROUP}", "-n", self.example.namespace,
            f"--field-selector=metadata.name={self.example.pool}",
            "--watch", "--output-watch-events", "-o", "json",
        ), self.on_pool)

    async def watch_pods(self) -> None:
        await follow(self.kubectl.argv(
            "get", "pods", "-n", self.example.namespace, "-l", harness.LABEL_SERVER,
            "--watch", "--output-watch-events", "-o", "json",
        ), self.on_pod)

    async def watch_router(self, session: aiohttp.ClientSession) -> None:
        while True:
            if self.router_metrics_url is not None:
                try:
                    async with session.get(self.router_metrics_url) as response:
                        held = held_by_member(await response.text())
                except aiohttp.ClientError:
                    held = self.held
                for member, count in sorted(held.items()):
                    if count != self.held.get(member, 0):
                        self.timeline.say("router", f"holds {count} request(s) for {member}")
                self.held = held
            await asyncio.sleep(METRICS_INTERVAL)

    async def until(self, check: Callable[[PoolView], bool], what: str, within: float) -> None:
        try:
            async with asyncio.timeout(within):
                while not check(self.pool):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError as e:
            raise DemoError(f"timed out after {within:g}s waiting for {what}") from e


# Requests


@dataclass(frozen=True)
class Answer:
    number: int
    model: str
    first_byte: float
    total: float
    text: str


async def ask(
    client: openai.AsyncOpenAI, timeline: Timeline, number: int, model: str
) -> Answer:
    """One streamed chat completion, narrated: sent, first token, done."""
    timeline.say("client", f"#{number} -> {model}: {PROMPT!r}")
    start = time.monotonic()
    first: float | None = None
    parts: list[str] = []
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], stream=True, max_tokens=8
    )
    async for chunk in stream:
        if first is None:
            first = time.monotonic() - start
            timeline.say("client", f"#{number} <- {model}: first token after {first:.2f}s")
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
    total = time.monotonic() - start
    text = "".join(parts).strip()
    timeline.say("client", f"#{number} <- {model}: done in {total:.2f}s: {text!r}")
    return Answer(number, model, first if first is not None else total, total, text)


# The script


async def _reconciler_phases(
    session: aiohttp.ClientSession, url: str, example: Example
) -> dict[str, float]:
    async with session.get(url) as response:
        return phase_seconds(await response.text(), example.namespace, example.pool)


async def _swaps(session: aiohttp.ClientSession, url: str, example: Example) -> float:
    """The reconciler's count of completed swaps of the example pool."""
    async with session.get(url) as response:
        text = await response.text()
    return sum(
        value
        for labels, value in metric_samples(text, "modelpool_swaps_total").items()
        if dict(labels).get("namespace") == example.namespace
        and dict(labels).get("pool") == example.pool
    )


def _phase_line(before: Mapping[str, float], after: Mapping[str, float]) -> str:
    parts = [
        f"{phase} {after[phase] - before.get(phase, 0.0):.2f}s"
        for phase in ("drain", "unload", "schedule", "load")
        if phase in after and after[phase] - before.get(phase, 0.0) > 0.0005
    ]
    return ", ".join(parts) if parts else "no phase recorded"


async def _install_examples(
    kubectl: Kubectl, example: Example, narrator: Narrator, wait: float
) -> harness.Pod:
    """Apply examples/ and wait (in threads: kubectl blocks) until the router and pool are
    Ready; return the router's pod. A pool that cannot load because the scheduler will
    not place its member ends the wait with the pool's own words."""
    await asyncio.to_thread(harness.install_examples, kubectl)
    (router,) = await asyncio.to_thread(
        harness.wait_router_ready, kubectl, example.namespace, example.router, None, wait
    )
    try:
        await asyncio.to_thread(
            harness.wait_pool_ready, kubectl, example.namespace, example.pool, None, wait
        )
    except AssertionError as e:
        blocked = narrator.pool.unschedulable
        if blocked is None:
            raise
        raise DemoError(f"pool {example.namespace}/{example.pool} cannot load after "
                        f"{wait:g}s: {blocked}") from e
    return router


async def script(
    out: TextIO, kubectl: Kubectl, example: Example, reconciler: harness.Pod,
    wait: float = 180.0,
) -> harness.Pod:
    """Install the example pool and run the requests, narrated; return the router's pod."""
    import openai

    timeline = Timeline(out)
    narrator = Narrator(timeline, kubectl, example)
    reconciler_metrics = harness.metrics_url(reconciler)
    async with aiohttp.ClientSession(trust_env=False) as session:
        # Plain tasks, not a TaskGroup: they run until cancelled, and an error of the script
        # should reach the caller as itself, not wrapped in an ExceptionGroup.
        watches = [
            asyncio.create_task(narrator.watch_pool()),
            asyncio.create_task(narrator.watch_pods()),
            asyncio.create_task(narrator.watch_router(session)),
        ]
        try:
            timeline.heading(
                f"0. kubectl apply --server-side -k examples: pool {example.pool} of "
                f"{', '.join(example.members)} in {example.namespace}, router "
                f"{example.router}; the pool cold-loads {example.default}"
            )
            router = await _install_examples(kubectl, example, narrator, wait)
            narrator.router_metrics_url = harness.metrics_url(router)
            timeline.say("router", f"{example.router} is Ready at {router.ip}")
            client = openai.AsyncOpenAI(
                base_url=harness.base_url(router), api_key="not-needed", max_retries=0,
                timeout=REQUEST_TIMEOUT,
            )
            await narrator.until(lambda p: p.phase != "-", "the pool's status", 30.0)
            resident = narrator.pool.resident or example.default
            other = next(m for m in example.members if m != resident)

            timeline.heading(f"1. {resident} is resident: a request is served at once")
            await ask(client, timeline, 1, resident)

            timeline.heading(f"2. a request for {other}: held while {resident} unloads and "
                             f"{other} loads (a cold load)")
            before = await _reconciler_phases(session, reconciler_metrics, example)
            answer = await ask(client, timeline, 2, other)
            await narrator.until(lambda p: p.swap is None and p.resident == other,
                                 "the swap to end", 30.0)
            after = await _reconciler_phases(session, reconciler_metrics, example)
            timeline.say("reconciler", f"swap phases: {_phase_line(before, after)}")
            timeline.say("summary", f"{other} answered {answer.first_byte:.2f}s after the "
                                    "request arrived, swap included")

            timeline.heading(f"3. {BURST} concurrent requests for {resident}: all held, "
                             "coalesced onto one swap")
            before = after
            swaps_before = await _swaps(session, reconciler_metrics, example)
            answers = await asyncio.gather(*(
                ask(client, timeline, 3 + i, resident) for i in range(BURST)
            ))
            await narrator.until(lambda p: p.swap is None and p.resident == resident,
                                 "the swap to end", 30.0)
            after = await _reconciler_phases(session, reconciler_metrics, example)
            swaps = await _swaps(session, reconciler_metrics, example) - swaps_before
            timeline.say("reconciler", f"swap phases: {_phase_line(before, after)}")
            slowest = max(a.first_byte for a in answers)
            timeline.say("summary", f"{len(answers)} requests answered, the slowest first "
                                    f"token after {slowest:.2f}s; swaps for them: {swaps:.0f}")
            async with session.get(narrator.router_metrics_url) as response:
                text = await response.text()
            timeline.say("router", "requests served on the resident without asking for a "
                                   "swap (coalesced_total): "
                                   f"{counter_total(text, 'modelpool_coalesced_total'):.0f}")
            await client.close()
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
    return router


def _print_ready(
    out: TextIO, kubectl: Kubectl, example: Example, router: harness.Pod, state_dir: Path
) -> None:
    base = harness.base_url(router)
    models = ", ".join(example.members)
    print(f"""
modelpool is running. The router ({example.namespace}/{example.router}, models {models}):
  {base}
  metrics: {harness.metrics_url(router)}

Try it:
  curl -s {base}/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{example.members[-1]}", "messages": [{{"role": "user", "content": "hi"}}]}}'

Watch the pool:
  kubectl --kubeconfig={kubectl.kubeconfig} -n {example.namespace} get modelpools -w

Stop everything:
  modelpool-local down --state-dir {state_dir}
""", file=out, flush=True)


def _already_running(kubectl: Kubectl, example: Example) -> harness.Pod | None:
    """The router's pod when the demo's pool exists and its router is Ready now, else
    None. The pool may be swapping: that is the demo at work, not a reason to start over."""
    try:
        harness.get(kubectl, example.namespace, f"modelpools.{harness.GROUP}", example.pool)
        (router,) = harness.wait_router_ready(kubectl, example.namespace, example.router,
                                              None, 0.0)
    except (AssertionError, DemoError, ValueError):
        return None
    return router


def run_demo(
    state_dir: Path, out: TextIO = sys.stdout, gpus: int = 1, wait: float = 180.0
) -> int:
    """Bring everything up, narrate the script, leave it running. `wait` bounds each wait
    for the example's router and pool to turn Ready."""
    try:
        # Imported here so that `modelpool-local up` needs no test dependencies.
        import openai
    except ImportError:
        print("the demo talks to the router with the openai SDK: pip install -e '.[test]'",
              file=sys.stderr)
        return 2
    # The SDK's HTTP client logs every request at INFO; the timeline says it better.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    running = controlplane.healthy(state_dir)
    if running is not None:
        kubectl = _kubectl(running)
        example = example_names(harness.rendered_install(kubectl, harness.EXAMPLES))
        router = _already_running(kubectl, example)
        if router is not None:
            print(f"== the demo is already running in {running.state_dir}: nothing was "
                  "started or changed", file=out, flush=True)
            _print_ready(out, kubectl, example, router, running.state_dir)
            return 0
    print("== starting the local cluster (the first run builds Kubernetes: minutes)",
          file=out, flush=True)
    try:
        cluster = controlplane.up(
            controlplane.UpOptions(state_dir=state_dir, python=sys.executable, gpus=gpus)
        )
    except controlplane.ClusterError as e:
        print(f"the cluster did not come up: {e}", file=sys.stderr)
        return 1
    kubectl = _kubectl(cluster)
    try:
        example = example_names(harness.rendered_install(kubectl, harness.EXAMPLES))
        print("== installing modelpool: kubectl apply --server-side -k overlays/local",
              file=out, flush=True)
        installation = harness.install(kubectl)
        reconciler = harness.wait_reconciler_ready(kubectl, installation)
        router = asyncio.run(script(out, kubectl, example, reconciler, wait))
    except (DemoError, AssertionError, TimeoutError, openai.OpenAIError) as e:
        print(f"the demo stopped: {e}\nlogs: {cluster.layout.logs} and the pods' logs under "
              f"{cluster.node_state_dir}", file=sys.stderr)
        return 1
    _print_ready(out, kubectl, example, router, cluster.state_dir)
    return 0


def _kubectl(cluster: controlplane.LocalCluster) -> Kubectl:
    return Kubectl(cluster.kubeconfig, shutil.which("kubectl") or str(cluster.bin_dir
                                                                       / "kubectl"))


def add_parser(commands: Any, parents: Sequence[Any]) -> None:
    """The `demo` subcommand of `modelpool-local`."""
    demo = commands.add_parser(
        "demo", parents=list(parents),
        help="start everything, install the example pool, show a swap; leaves it running",
    )
    demo.add_argument("--gpus", type=int, default=1, help="fake nvidia.com/gpu on the node")
    demo.add_argument("--wait", type=float, default=180.0,
                      help="seconds to wait for the example's router and pool to be Ready")


def main(args: Any) -> int:
    """`modelpool-local demo` (args from the CLI's parser)."""
    return run_demo(Path(args.state_dir), gpus=int(args.gpus), wait=float(args.wait))

