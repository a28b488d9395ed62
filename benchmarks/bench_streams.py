"""Streaming at the scale LLM serving makes: N concurrent streams (default 1,000), each a
chunk every 20 ms (50 tokens/s) for 30 s, through one router process, beside nginx on the
same load and the upstream called directly.

The upstream and the client are `benchmarks/streamload` (Go, standard library; built here
with the machine's Go into a cache): the upstream stamps every chunk with the wall-clock
time it wrote it, the client records how long after its stamp each chunk arrived. So the
"delay" of a chunk is the whole path from the upstream's write to the client's read, and
what a proxy adds is its delay minus the direct one. Measured for each proxy: the delay's
p50/p99, its CPU per relayed chunk (user + system from /proc/PID/stat over the run), and
its RSS at the end of the run and at peak (VmHWM). Rounds alternate the order.

nginx is Debian's (`apt-get install nginx`), one worker, `proxy_buffering off` as an SSE
proxy is configured.

With `--pin` the proxies (nginx's worker, the router) run on one CPU and the load (the
upstream and the client) on the others, so that a proxy's added delay is its own and not
its wait for a core the load generator holds, as when the router has a CPU of its own in
its pod. Without it every process shares every CPU.

    .venv/bin/python benchmarks/bench_streams.py                  # 1,000 streams, 30 s, 1 round
    .venv/bin/python benchmarks/bench_streams.py --streams 200 --seconds 10 --rounds 2
    .venv/bin/python benchmarks/bench_streams.py --pin            # proxies on a CPU of their own
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for entry in (str(REPO), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import bench_peers  # noqa: E402
import bench_router  # noqa: E402

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CACHE = Path(os.environ.get("MODELPOOL_CACHE", Path.home() / ".cache" / "modelpool"))


def build_streamload() -> Path:
    binary = CACHE / "bench" / "streamload"
    sources = sorted((HERE / "streamload").glob("*"))
    if binary.exists() and all(binary.stat().st_mtime >= s.stat().st_mtime for s in sources):
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "streamload",
                   check=True, env={**os.environ, "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"})
    return binary


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def cpu_sets(pin: bool) -> tuple[list[str], list[str]]:
    """The `taskset` prefixes of (the proxies, the load): empty unless pinning."""
    if not pin:
        return [], []
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs at least")
    if shutil.which("taskset") is None:
        raise SystemExit("missing: taskset (apt-get install util-linux)")
    load = ",".join(str(c) for c in cpus[:-1])
    return ["taskset", "-c", str(cpus[-1])], ["taskset", "-c", load]


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def nginx_sse_conf(work: Path, port: int, upstream: int) -> Path:
    return bench_peers.nginx_conf(work, port, (
        f" upstream up {{ server {HOST}:{upstream}; keepalive 1024; }}\n"
        f" server {{ listen {HOST}:{port} backlog=4096;\n"
        "  location / { proxy_pass http://up; proxy_http_version 1.1;\n"
        '   proxy_set_header Connection ""; proxy_buffering off; proxy_read_timeout 300s; } }'))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each stream lasts")
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pin", action="store_true",
                        help="the proxies on the last CPU, the upstream and client on the others")
    args = parser.parse_args()
    proxy_cpu, load_cpus = cpu_sets(args.pin)
    if shutil.which("nginx") is None:
        raise SystemExit("missing: nginx (apt-get install nginx)")
    streamload = build_streamload()
    processes: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}

    def spawn(argv: list[str], port: int, what: str, **kw: object) -> subprocess.Popen[bytes]:
        log = open(work / f"{what}.log", "wb")  # noqa: SIM115 (lives as long as the process)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **kw)  # type: ignore[call-overload]
        processes.append(process)
        bench_peers.wait_port(port, process, what)
        return process

    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:
        work = Path(tmp)
        upstream = bench_router.free_port()
        spawn([*load_cpus, str(streamload), "upstream", "-listen", f"{HOST}:{upstream}",
               "-interval", f"{args.interval_ms}ms", "-duration", f"{args.seconds}s"],
              upstream, "upstream")
        urls = {"direct": f"http://{HOST}:{upstream}"}
        port = bench_router.free_port()
        nginx = spawn([*proxy_cpu, "nginx", "-c", str(nginx_sse_conf(work, port, upstream))],
                      port, "nginx")
        urls["nginx"] = f"http://{HOST}:{port}"
        # nginx's master forks the one worker that does the work
        deadline = time.monotonic() + 10.0
        children: list[str] = []
        while not children and time.monotonic() < deadline:
            children = Path(f"/proc/{nginx.pid}/task/{nginx.pid}/children").read_text().split()
        pids["nginx"] = int(children[0])
        config = work / "router.json"
        bench_router.write_config(config, upstream, pooled=False)
        port, metrics = bench_router.free_port(), bench_router.free_port()
        router = spawn([*proxy_cpu, sys.executable, "-m", "sidecar", "--config", str(config),
                        "--port", str(port), "--metrics-port", str(metrics)], port, "router",
                       cwd=str(REPO),
                       env={**os.environ, "PYTHONPATH": str(REPO),
                            "MODELPOOL_LOG_LEVEL": "warning"})
        pids["modelpool router"] = router.pid
        urls["modelpool router"] = f"http://{HOST}:{port}"
        try:
            for round_ in range(args.rounds):
                order = list(urls.items())
                if round_ % 2:
                    order.reverse()
                for name, base in order:
                    pid = pids.get(name)
                    cpu_before = cpu_seconds(pid) if pid else 0.0
                    out = subprocess.run(
                        [*load_cpus, str(streamload), "client",
                         "-url", f"{base}/v1/chat/completions", "-streams", str(args.streams)],
                        capture_output=True, text=True, check=True,
                        timeout=args.seconds + 120).stdout
                    figures = json.loads(out)
                    if pid:
                        figures["cpu_s"] = cpu_seconds(pid) - cpu_before
                        figures["rss_mb"], figures["hwm_mb"] = memory_mb(pid)
                    results.setdefault(name, []).append(figures)
                    print(f"round {round_ + 1} {name}: {json.dumps(figures)}", file=sys.stderr)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
    chunks_expected = args.streams * args.seconds * 1000 / args.interval_ms
    print(f"{args.streams} streams, a chunk every {args.interval_ms:g} ms for {args.seconds:g} s "
          f"(about {chunks_expected:,.0f} chunks per run), {args.rounds} round(s), "
          f"load average {os.getloadavg()[0]:.1f}"
          + (f", proxies on CPU {proxy_cpu[-1]}, load on CPU {load_cpus[-1]}" if args.pin else ""))
    print("| path | streams done | chunk delay p50 | p99 | added p50 | added p99 | "
          "CPU per chunk | RSS end / peak |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    direct = results["direct"]
    d50 = sum(r["p50_us"] for r in direct) / len(direct)
    d99 = sum(r["p99_us"] for r in direct) / len(direct)
    for name, runs in results.items():
        p50 = sum(r["p50_us"] for r in runs) / len(runs)
        p99 = sum(r["p99_us"] for r in runs) / len(runs)
        done = sum(int(r["done"]) for r in runs)
        errors = sum(int(r["errors"]) for r in runs)
        cells = [f"{done}/{args.streams * len(runs)}" + (f" ({errors} errors)" if errors else ""),
                 f"{p50 / 1000:.2f} ms", f"{p99 / 1000:.2f} ms"]
        if name == "direct":
            cells += ["", "", "", ""]
        else:
            # every chunk of every stream that ended went through (the client counts only
            # those after its ramp-up)
            relayed = sum(int(r["done"]) for r in runs) * args.seconds * 1000 / args.interval_ms
            cpu = sum(r["cpu_s"] for r in runs) / relayed * 1e6
            cells += [f"+{(p50 - d50) / 1000:.2f} ms", f"+{(p99 - d99) / 1000:.2f} ms",
                      f"{cpu:.1f} us",
                      f"{runs[-1]['rss_mb']:.0f} / {max(r['hwm_mb'] for r in runs):.0f} MB"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
