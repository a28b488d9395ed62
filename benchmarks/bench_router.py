"""Router benchmark: what the router adds over calling the model server directly.

Everything runs in one go on loopback against one fake upstream (a minimal OpenAI-shaped
aiohttp server in its own process, so the figures measure the router, not a model):

1. added latency p50/p99, router vs direct, at 1, 16 and 64 concurrent clients, and the
   throughput ratio router/direct (direct and router batches alternate, samples pooled);
   the same for Anthropic Messages (`/v1/messages`) at 1 and 16 clients, beside chat's;
2. streaming time to first byte added;
3. held requests: N concurrent requests held during a swap, all answered after it, with
   the router's peak RSS (the router runs the real Activation against an in-process fake
   of the API server that plays the reconciler; the swap completes on SIGUSR1);
4. endpoint ready to dispatch: from the fake API server delivering the EndpointSlice event
   that makes the target member ready to the upstream receiving the released request.

    .venv/bin/python benchmarks/bench_router.py            # full run, prints the table
    .venv/bin/python benchmarks/bench_router.py --quick    # smaller counts, a smoke test

    .venv/bin/python benchmarks/bench_router.py --only held --held 50000 --routers 3

Internal sub-commands start the other processes: `upstream`, `fake-kube-router` and
`hold-client`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HOST = "127.0.0.1"
NAMESPACE = "bench"
CHAT_BODY = json.dumps(
    {"model": "coder", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
).encode()
MESSAGES_BODY = json.dumps(
    {"model": "coder", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
).encode()
CHAT = ("/v1/chat/completions", CHAT_BODY)
MESSAGES = ("/v1/messages", MESSAGES_BODY)
STREAM_BODY = json.dumps(
    {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()
REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "coder",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
).encode()


def raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


# --- the fake upstream --------------------------------------------------------------------


async def upstream_handler(request: web.Request) -> web.StreamResponse:
    arrived = time.monotonic()
    body = await request.read()
    headers = {"X-Arrived": repr(arrived)}
    if b'"stream": true' not in body:
        return web.Response(body=REPLY, content_type="application/json", headers=headers)
    response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(3):
        if i:
            await asyncio.sleep(0.005)
        await response.write(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n')
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def serve_upstream(port: int) -> None:
    raise_fd_limit()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream_handler)
    app.router.add_post("/v1/messages", upstream_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port, backlog=4096).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


# --- the router with a fake API server that plays the reconciler ----------------------------


def fake_kube_router(argv: list[str]) -> None:
    """`fake-kube-router --upstream-port P --swap {signal,auto} ROUTER-FLAGS`.

    Pool `heavy` with members coder and gemma, coder resident. A request for the other
    member is written by the router; the fake then completes the swap (on SIGUSR1, or at
    once with `auto`): status names the new resident, then its EndpointSlice turns ready,
    and a line `ready <member> <monotonic>` goes to stdout.
    """
    from sidecar.__main__ import run, serve
    from sidecar.activation import Activation
    from sidecar.activator import PoolStatus, WriteRequest
    from sidecar.config import RouterConfig
    from sidecar.metrics import RouterMetrics
    from sidecar.settings import Settings, from_args
    from telemetry.logs import configure_logging as setup_logging
    from tests.kube_fake import FakeCluster

    p = argparse.ArgumentParser()
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--swap", choices=["signal", "auto"], required=True)
    own, rest = p.parse_known_args(argv)

    class SwappingCluster(FakeCluster):
        """Completes the swap each written request asks for: at once, or on SIGUSR1."""

        def __init__(self) -> None:
            super().__init__(write_delay=0.0)
            self.set_pool("heavy", resident_member="coder")
            self.set_endpoints("coder", HOST, port=own.upstream_port)
            self.swap_now = asyncio.Event()
            if own.swap == "auto":
                self.swap_now.set()

        async def _swap(self, member: str) -> None:
            await self.swap_now.wait()
            if own.swap == "signal":
                self.swap_now.clear()
            old = self.pools["heavy"].resident_member
            self.set_pool("heavy", resident_member=member)
            await asyncio.sleep(0.01)  # the status event is handled before the slice's
            if old is not None:
                self.set_endpoints(old, port=own.upstream_port)  # none left
            print(f"ready {member} {time.monotonic()!r}", flush=True)
            self.set_endpoints(member, HOST, port=own.upstream_port)

        async def write_request(self, namespace: str, pool: str, write: WriteRequest) -> PoolStatus:
            status = await super().write_request(namespace, pool, write)
            member = write.request.member
            if member is not None and member != status.resident_member:
                asyncio.get_running_loop().create_task(self._swap(member))
            return status

    async def make_activation(
        config: RouterConfig, metrics: RouterMetrics, settings: Settings
    ) -> Activation:
        api = SwappingCluster()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, api.swap_now.set)
        return Activation(config, api, metrics, identity=f"{NAMESPACE}/bench/{settings.pod_name}")

    raise_fd_limit()
    settings = from_args(rest, os.environ)
    setup_logging("WARNING")
    run(serve(settings, make_activation))


# --- processes ----------------------------------------------------------------------------


def backend(name: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "aliases": [],
        "modelServer": None,
        "service": None,
        "port": None,
    }
    return {**base, "pool": None, "url": None, **fields}


def write_config(path: Path, upstream_port: int, pooled: bool) -> None:
    if pooled:
        backends = [
            backend(m, modelServer=m, service=m, port=upstream_port, pool="heavy")
            for m in ("coder", "gemma")
        ]
        pools = [
            {
                "name": "heavy",
                "members": ["coder", "gemma"],
                "default": "coder",
                "swapPolicy": "sticky",
                "swapBudgetSeconds": 300,
                "maxWaitSeconds": None,
                "minResidencySeconds": 0,
            }
        ]
    else:
        backends = [backend("coder", url=f"http://{HOST}:{upstream_port}")]
        pools = []
    config = {
        "version": 1,
        "router": {"namespace": NAMESPACE, "name": "bench"},
        "routeStrategy": "BackendNameMatch",
        "defaultRoute": "coder",
        "responseHeaderTimeoutSeconds": 600,
        "maxHeldRequests": 100_000,
        "backends": backends,
        "pools": pools,
    }
    path.write_text(json.dumps(config))


@dataclass
class Proc:
    process: asyncio.subprocess.Process
    port: int
    metrics_port: int = 0
    lines: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        return self._status_mb("VmHWM")

    def rss_mb(self) -> float:
        return self._status_mb("VmRSS")

    def _status_mb(self, key: str) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {key}")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def start(
    args: list[str], port: int, metrics_port: int = 0, logs: Path | None = None
) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELPOOL_")}
    env["MODELPOOL_BIND_HOST"] = HOST
    stderr = logs.open("ab") if logs else asyncio.subprocess.DEVNULL
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr
    )
    proc = Proc(process, port, metrics_port)

    async def pump() -> None:
        assert process.stdout is not None
        async for line in process.stdout:
            proc.lines.put_nowait(line.decode().strip())

    asyncio.get_running_loop().create_task(pump())
    async with aiohttp.ClientSession() as s:
        deadline = time.monotonic() + 30
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"{args} exited with {process.returncode}")
            try:
                async with s.post(f"http://{HOST}:{port}/v1/chat/completions", data=CHAT_BODY):
                    break
            except aiohttp.ClientConnectionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    return proc


async def start_router(config: Path, *extra: str, logs: Path) -> Proc:
    port, metrics_port = free_port(), free_port()
    args = [
        *extra,
        "--config",
        str(config),
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
    ]
    if not extra:
        args = ["-m", "sidecar", *args]
    return await start(args, port, metrics_port, logs)


# --- load ---------------------------------------------------------------------------------


@dataclass
class Batch:
    latencies: list[float]
    elapsed: float
    errors: int

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed


async def closed_loop(
    session: aiohttp.ClientSession, url: str, concurrency: int, total: int,
    api: tuple[str, bytes] = CHAT,
) -> Batch:
    """`concurrency` clients, each sending its next request as soon as one is answered."""
    latencies: list[float] = []
    errors = 0
    remaining = total
    path, body = api
    endpoint = url + path

    async def client() -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            async with session.post(endpoint, data=body) as resp:
                await resp.read()
                ok = resp.status == 200
            latencies.append(time.perf_counter() - t0)
            errors += not ok

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return Batch(latencies, time.perf_counter() - started, errors)


async def first_bytes(session: aiohttp.ClientSession, url: str, total: int) -> list[float]:
    times = []
    for _ in range(total):
        t0 = time.perf_counter()
        async with session.post(url + "/v1/chat/completions", data=STREAM_BODY) as resp:
            await resp.content.readany()
            times.append(time.perf_counter() - t0)
            await resp.read()
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


# --- scenarios ----------------------------------------------------------------------------


@dataclass
class Results:
    rows: list[list[str]] = field(default_factory=list)
    held: dict[str, Any] = field(default_factory=dict)
    ready: dict[str, Any] = field(default_factory=dict)


async def alternate(
    session: aiohttp.ClientSession, upstream: Proc, router: Proc, concurrency: int,
    per_round: int, rounds: int, api: tuple[str, bytes],
) -> tuple[Batch, Batch, dict[str, float]]:
    """Direct and router batches of `api`, alternating for `rounds`: both sides' samples
    pooled, and each process's CPU seconds."""
    d, r = Batch([], 0.0, 0), Batch([], 0.0, 0)
    cpu = {"upstream": 0.0, "router": 0.0}
    for _ in range(rounds):
        for acc, proc in ((d, upstream), (r, router)):
            before = proc.cpu_seconds()
            b = await closed_loop(session, proc.url, concurrency, per_round, api)
            cpu["upstream" if proc is upstream else "router"] += proc.cpu_seconds() - before
            acc.latencies += b.latencies
            acc.elapsed += b.elapsed
            acc.errors += b.errors
    assert d.errors == r.errors == 0, (d.errors, r.errors)
    return d, r, cpu


async def proxy_overhead(
    upstream: Proc,
    router_proc: Proc,
    counts: dict[int, int],
    rounds: int,
    ttfb_count: int,
    out: Results,
) -> None:
    direct, router = upstream.url, router_proc.url
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await closed_loop(session, direct, 16, 500)  # warm both paths and their pools
        await closed_loop(session, router, 16, 500)
        for concurrency, total in counts.items():
            d, r, cpu = await alternate(session, upstream, router_proc, concurrency,
                                        total // rounds, rounds, CHAT)
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                dv, rv = pct(d.latencies, q), pct(r.latencies, q)
                out.rows.append(
                    [
                        f"latency {name}, {concurrency} clients",
                        ms(dv),
                        ms(rv),
                        f"+{ms(rv - dv)}",
                        f"{rv / dv:.2f}",
                    ]
                )
            out.rows.append(
                [
                    f"throughput, {concurrency} clients (req/s)",
                    f"{d.rps:.0f}",
                    f"{r.rps:.0f}",
                    f"{r.rps - d.rps:+.0f}",
                    f"{r.rps / d.rps:.2f}",
                ]
            )
            up_us = cpu["upstream"] / len(d.latencies) * 1e6
            router_us = cpu["router"] / len(r.latencies) * 1e6
            out.rows.append(
                [
                    f"CPU per request, {concurrency} clients (us; direct: upstream process, "
                    "router: router process)",
                    f"{up_us:.0f}",
                    f"{router_us:.0f}",
                    "",
                    f"{router_us / up_us:.2f}",
                ]
            )
            print(f"  {concurrency:>3} clients: {len(d.latencies)} requests each side", flush=True)
        for concurrency in (1, 16):
            d, r, _ = await alternate(session, upstream, router_proc, concurrency,
                                      counts[concurrency] // rounds, rounds, MESSAGES)
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                dv, rv = pct(d.latencies, q), pct(r.latencies, q)
                out.rows.append([f"/v1/messages latency {name}, {concurrency} clients",
                                 ms(dv), ms(rv), f"+{ms(rv - dv)}", f"{rv / dv:.2f}"])
            print(f"  {concurrency:>3} clients on /v1/messages: {len(d.latencies)} requests "
                  "each side", flush=True)
        d_t, r_t = [], []
        for _ in range(rounds):
            d_t += await first_bytes(session, direct, ttfb_count // rounds)
            r_t += await first_bytes(session, router, ttfb_count // rounds)
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            dv, rv = pct(d_t, q), pct(r_t, q)
            out.rows.append(
                [
                    f"stream time to first byte {name}",
                    ms(dv),
                    ms(rv),
                    f"+{ms(rv - dv)}",
                    f"{rv / dv:.2f}",
                ]
            )


async def metric(session: aiohttp.ClientSession, proc: Proc, name: str) -> float:
    async with session.get(f"http://{HOST}:{proc.metrics_port}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def until(check: Callable[[], Any], limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.1)


async def hold_client(url: str, n: int) -> None:
    """`hold-client --url U --n N`: N requests for gemma at once (ramped), each read to its
    end; prints `sent` once all are sent, then one JSON line of statuses and failures."""
    raise_fd_limit()
    gemma = json.dumps({"model": "gemma", "messages": []}).encode()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    statuses: Counter[int] = Counter()
    failures: Counter[str] = Counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> None:
            try:
                async with session.post(url + "/v1/chat/completions", data=gemma) as resp:
                    body = await resp.read()
                    statuses[resp.status] += 1
                    if resp.status != 200:
                        failures[f"{resp.status} {body[:120]!r}"] += 1
            except aiohttp.ClientError as e:
                statuses[0] += 1
                failures[f"client: {e!r}"[:160]] += 1

        tasks = []
        for i in range(0, n, 500):  # ramp, so connects do not overflow the listen backlog
            tasks += [asyncio.create_task(one()) for _ in range(min(500, n - i))]
            await asyncio.sleep(0.05)
        print("sent", flush=True)
        await asyncio.gather(*tasks)
    print(json.dumps({"statuses": dict(statuses), "failures": dict(failures)}), flush=True)


async def held_requests(routers: list[Proc], n: int, out: Results) -> None:
    """n requests held during one swap, spread evenly over the routers, each router's share
    sent by a client process of its own (one process cannot have that many open files)."""
    shares = [n // len(routers) + (i < n % len(routers)) for i in range(len(routers))]
    rss_before = [r.peak_rss_mb() for r in routers]
    started = time.monotonic()
    clients = []
    for router, share in zip(routers, shares, strict=True):
        clients.append(await asyncio.create_subprocess_exec(
            sys.executable, __file__, "hold-client", "--url", router.url, "--n", str(share),
            cwd=REPO, stdout=asyncio.subprocess.PIPE))
    async with aiohttp.ClientSession() as session:

        async def all_held() -> bool:
            for router, share in zip(routers, shares, strict=True):
                if await metric(session, router, "modelpool_held_requests") < share:
                    return False
            return True

        await until(all_held, 120, f"{n} requests held")
    held_after = time.monotonic() - started
    rss_held = [r.rss_mb() for r in routers]
    swap = time.monotonic()
    for router in routers:
        router.process.send_signal(signal.SIGUSR1)
    statuses: Counter[int] = Counter()
    failures: Counter[str] = Counter()
    for client in clients:
        assert client.stdout is not None
        lines = (await client.stdout.read()).decode().splitlines()
        await client.wait()
        assert lines[0] == "sent" and client.returncode == 0, (lines, client.returncode)
        report = json.loads(lines[-1])
        statuses.update({int(k): v for k, v in report["statuses"].items()})
        failures.update(report["failures"])
    drained = time.monotonic() - swap
    out.held = {
        "n": n,
        "routers": len(routers),
        "ok": statuses[200],
        "seconds_to_hold_all": held_after,
        "seconds_to_answer_all": drained,
        "rss_start_mb": sum(rss_before),
        "rss_held_mb": sum(rss_held),
        "peak_rss_mb": sum(r.peak_rss_mb() for r in routers),
        "failures": dict(failures),
    }


async def ready_to_dispatch(router: Proc, swaps: int, out: Results) -> None:
    latencies = []
    async with aiohttp.ClientSession() as session:
        for i in range(swaps):
            member = "gemma" if i % 2 == 0 else "coder"
            body = json.dumps({"model": member, "messages": []}).encode()
            async with session.post(router.url + "/v1/chat/completions", data=body) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
                arrived = float(resp.headers["X-Arrived"])
            line = await asyncio.wait_for(router.lines.get(), 10)
            kind, who, at = line.split()
            assert kind == "ready" and who == member, line
            latencies.append(arrived - float(at))
    out.ready = {
        "swaps": swaps,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": pct(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
    }


# --- report -------------------------------------------------------------------------------


def table(out: Results) -> str:
    head = ["measure", "direct", "router", "added", "ratio router/direct"]
    rows = [head, ["---"] * len(head), *out.rows]
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    if out.held:
        h = out.held
        per_held = (h["rss_held_mb"] - h["rss_start_mb"]) * 1024 / h["n"]
        per_peak = (h["peak_rss_mb"] - h["rss_start_mb"]) * 1024 / h["n"]
        where = "" if h["routers"] == 1 else f" over {h['routers']} router processes"
        summed = "" if h["routers"] == 1 else ", summed"
        lines += [
            "",
            f"held during a swap{where}: {h['ok']}/{h['n']} answered 200 after it; all held "
            f"in {h['seconds_to_hold_all']:.1f} s; all answered "
            f"{h['seconds_to_answer_all']:.2f} s after the swap",
            f"router RSS{summed}: idle {h['rss_start_mb']:.0f} MB, all held "
            f"{h['rss_held_mb']:.0f} MB ({per_held:.1f} KB per held request), peak while "
            f"answering {h['peak_rss_mb']:.0f} MB ({per_peak:.1f} KB per held request)",
            *(f"  failed: {n} x {what}" for what, n in h["failures"].items()),
        ]
    if out.ready:
        r = out.ready
        lines += [
            f"endpoint ready to dispatch over {r['swaps']} swaps: p50 {r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms",
        ]
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> Results:
    raise_fd_limit()
    out = Results()
    scale = 0.25 if args.quick else 1.0
    counts = {1: int(1000 * scale), 16: int(3000 * scale), 64: int(4000 * scale)}
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "router.log"
        up_port = free_port()
        upstream = await start([__file__, "upstream", "--port", str(up_port)], up_port)
        procs = [upstream]
        try:
            direct_config = Path(tmp) / "direct.json"
            write_config(direct_config, up_port, pooled=False)
            if args.only in (None, "proxy"):
                router = await start_router(direct_config, logs=logs)
                procs.append(router)
                print("proxy overhead (direct and router batches alternate)", flush=True)
                await proxy_overhead(
                    upstream, router, counts, rounds=4, ttfb_count=int(400 * scale), out=out
                )
                await router.stop()

            pooled = Path(tmp) / "pooled.json"
            write_config(pooled, up_port, pooled=True)
            common = [__file__, "fake-kube-router", "--upstream-port", str(up_port)]
            if args.only in (None, "held"):
                _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                share = -(-args.held // args.routers)
                if share > hard - 1500:
                    raise SystemExit(
                        f"{share} held requests per router need as many open files in the "
                        "router and in its client, and the router up to 1,024 more to the "
                        f"upstream once they are released; this machine allows {hard} per "
                        "process (raising the hard limit needs CAP_SYS_RESOURCE): use "
                        f"--routers {-(-args.held // (hard - 1500))} or more")
                held_routers = []
                for _ in range(args.routers):
                    held_routers.append(
                        await start_router(pooled, *common, "--swap", "signal", logs=logs))
                    procs.append(held_routers[-1])
                print(f"{args.held} requests held during a swap, over {args.routers} router "
                      "processes" if args.routers > 1 else
                      f"{args.held} requests held during a swap", flush=True)
                await held_requests(held_routers, args.held, out)
                for router in held_routers:
                    await router.stop()
            if args.only in (None, "ready"):
                ready_router = await start_router(pooled, *common, "--swap", "auto", logs=logs)
                procs.append(ready_router)
                print("endpoint ready to dispatch", flush=True)
                await ready_to_dispatch(ready_router, int(100 * scale), out)
        finally:
            for p in procs:
                await p.stop()
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "upstream":
        p = argparse.ArgumentParser()
        p.add_argument("--port", type=int, required=True)
        asyncio.run(serve_upstream(p.parse_args(sys.argv[2:]).port))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "hold-client":
        p = argparse.ArgumentParser()
        p.add_argument("--url", required=True)
        p.add_argument("--n", type=int, required=True)
        client_args = p.parse_args(sys.argv[2:])
        asyncio.run(hold_client(client_args.url, client_args.n))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "fake-kube-router":
        fake_kube_router(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a quarter of the requests")
    p.add_argument(
        "--only", choices=["proxy", "held", "ready"], default=None, help="run one scenario"
    )
    p.add_argument("--held", type=int, default=10_000, help="requests held during the swap")
    p.add_argument(
        "--routers", type=int, default=1,
        help="router processes the held requests are spread over (each needs an open file "
        "per held request)")
    args = p.parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    out = asyncio.run(bench(args))
    print()
    print(table(out))
    print(
        f"\n{platform.python_implementation()} {platform.python_version()}, "
        f"aiohttp {aiohttp.__version__}, {os.cpu_count()} CPUs, "
        f"load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end, "
        f"run took {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
