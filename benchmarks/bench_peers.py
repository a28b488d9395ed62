"""The router against its peers, in one run: the same upstream, the same client, rounds
alternated so that drifts of load hit every peer alike.

The upstream is nginx answering a fixed chat completion (about 260 bytes) from memory, so
it is never the bottleneck; the client is `wrk` (C, one thread) POSTing a chat request.
In front of the upstream, in turn:

- nothing (direct), the baseline every ratio is against;
- nginx as a keep-alive reverse proxy (`proxy_pass` to an upstream block with keepalive);
- HAProxy in HTTP mode with connection reuse;
- the modelpool router (`python -m sidecar`, one process, a static URL backend);
- LiteLLM's proxy (pinned, in a virtual environment of its own, one worker), when
  `--litellm` names its `litellm` program or `/tmp/litellm-venv/bin/litellm` exists.

nginx, HAProxy and wrk are Debian's (`apt-get install nginx haproxy wrk`); LiteLLM:
`python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]==1.106.12'`.

    .venv/bin/python benchmarks/bench_peers.py --rounds 3 --seconds 5
    .venv/bin/python benchmarks/bench_peers.py --bodies 200000,2000000   # large prompts
    .venv/bin/python benchmarks/bench_peers.py --compare /tmp/old  # and an older router
    .venv/bin/python benchmarks/bench_peers.py --bare  # and the floor (bare_proxy.py)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for entry in (str(REPO), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import bench_router  # noqa: E402
import bench_swap_kind  # noqa: E402 (the machine's CPU steal)

HOST = "127.0.0.1"
MODEL = "coder"
REPLY = (
    '{"id":"chatcmpl-1","object":"chat.completion","created":1764547200,"model":"coder",'
    '"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the '
    'upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":4,'
    '"total_tokens":9}}'
)
BODY = '{"model":"coder","messages":[{"role":"user","content":"Say something."}]}'
LITELLM_DEFAULT = Path("/tmp/litellm-venv/bin/litellm")


def free_port() -> int:
    return bench_router.free_port()


def wait_port(port: int, process: subprocess.Popen[bytes], what: str, within: float = 60.0
              ) -> None:
    """Until `port` accepts a connection (a server's start has no event to wait on)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited {process.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {within:g}s")


def nginx_conf(work: Path, listen: int, body: str) -> Path:
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = work / f"nginx-{listen}.conf"
    conf.write_text(
        f"{user}worker_processes 1;\ndaemon off;\npid {work}/nginx-{listen}.pid;\n"
        f"error_log {work}/nginx-{listen}.log warn;\n"
        "events { worker_connections 4096; }\n"
        "http {\n access_log off;\n client_max_body_size 64m;\n"
        f" client_body_temp_path {work}/body-{listen};\n"
        f" proxy_temp_path {work}/proxy-{listen};\n"
        f" fastcgi_temp_path {work}/fcgi-{listen};\n uwsgi_temp_path {work}/uwsgi-{listen};\n"
        f" scgi_temp_path {work}/scgi-{listen};\n"
        f"{body}\n}}\n")
    return conf


def upstream_conf(work: Path, port: int) -> Path:
    reply = REPLY.replace("'", "\\'")
    return nginx_conf(work, port, (
        f" server {{ listen {HOST}:{port}; keepalive_requests 1000000;\n"
        "  client_body_buffer_size 64k;\n"
        f"  location / {{ default_type application/json; return 200 '{reply}'; }} }}"))


def nginx_proxy_conf(work: Path, port: int, upstream: int) -> Path:
    return nginx_conf(work, port, (
        f" upstream up {{ server {HOST}:{upstream}; keepalive 64; keepalive_requests 1000000; }}\n"
        f" server {{ listen {HOST}:{port}; keepalive_requests 1000000;\n"
        "  location / { proxy_pass http://up; proxy_http_version 1.1;\n"
        '   proxy_set_header Connection ""; } }'))


def haproxy_conf(work: Path, port: int, upstream: int) -> Path:
    conf = work / "haproxy.cfg"
    conf.write_text(
        "global\n maxconn 4096\n nbthread 1\n"
        "defaults\n mode http\n timeout connect 5s\n timeout client 60s\n timeout server 60s\n"
        " option http-keep-alive\n http-reuse always\n"
        f"frontend fe\n bind {HOST}:{port}\n default_backend be\n"
        f"backend be\n server up {HOST}:{upstream}\n")
    return conf


def litellm_conf(work: Path, upstream: int) -> Path:
    conf = work / "litellm.yaml"
    conf.write_text(
        "model_list:\n"
        f"- model_name: {MODEL}\n"
        "  litellm_params:\n"
        f"    model: openai/{MODEL}\n"
        f"    api_base: http://{HOST}:{upstream}/v1\n"
        "    api_key: unused\n")
    return conf


def body_script(work: Path, size: int, model_first: bool) -> Path:
    """A wrk script POSTing a chat request of about `size` bytes, `model` first or last."""
    filler = max(0, size - 80)
    content = f'string.rep("the pool ", {filler // 9})'
    model = '"\\"model\\":\\"coder\\""'
    messages = '"\\"messages\\":[{\\"role\\":\\"user\\",\\"content\\":\\"" .. ' \
        + content + ' .. "\\"}]"'
    parts = f"{model} .. \",\" .. {messages}" if model_first else f"{messages} .. \",\" .. {model}"
    script = work / f"post-{size}-{'first' if model_first else 'last'}.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = "{{" .. {parts} .. "}}"\n'
                      'wrk.headers["Content-Type"] = "application/json"\n')
    return script


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and every process below it (nginx's workers, LiteLLM's)."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def wrk(url: str, connections: int, seconds: float, script: Path) -> tuple[float, float]:
    """(requests per second, p50 latency in microseconds) from one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
         url], capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)", out, re.M).groups()  # type: ignore[union-attr]
    scale = {"us": 1.0, "ms": 1e3, "s": 1e6}[unit]
    if re.search(r"Non-2xx or 3xx responses", out):
        raise SystemExit(f"{url} answered errors under load:\n{out}")
    return rps, float(value) * scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per wrk run")
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--bodies", default="",
                        help="prompt sizes in bytes (e.g. 200000,2000000): instead of the "
                        "table above, p50 at 1 connection with `model` first and last")
    parser.add_argument("--compare", type=Path, default=None, metavar="CHECKOUT",
                        help="also run the router of another checkout (a git worktree of an "
                        "older commit, say), as 'router at CHECKOUT'")
    parser.add_argument("--bare", action="store_true",
                        help="also run benchmarks/bare_proxy.py, the router's parts with "
                        "none of its logic: the floor under its CPU per request")
    parser.add_argument("--litellm", type=Path, default=None,
                        help=f"LiteLLM's program (default {LITELLM_DEFAULT} if present)")
    args = parser.parse_args()
    missing = [tool for tool in ("nginx", "haproxy", "wrk") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"missing: {' '.join(missing)} (apt-get install nginx haproxy wrk)")
    litellm = args.litellm or (LITELLM_DEFAULT if LITELLM_DEFAULT.exists() else None)
    connections = [int(c) for c in args.connections.split(",")]
    processes: list[subprocess.Popen[bytes]] = []

    pids: dict[str, int] = {}
    # Which spawned process stands in front of the upstream for each peer.
    front = {"direct": "upstream", "nginx": "nginx", "haproxy": "haproxy",
             "modelpool router": "router", "LiteLLM proxy": "litellm"}

    def spawn(argv: list[str], port: int, what: str, **kw: object) -> None:
        log = open(work / f"{what}.log", "wb")  # noqa: SIM115 (lives as long as the process)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **kw)  # type: ignore[call-overload]
        processes.append(process)
        pids[what] = process.pid
        wait_port(port, process, what, 120.0 if what == "litellm" else 30.0)

    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        work = Path(tmp)
        upstream = free_port()
        spawn(["nginx", "-c", str(upstream_conf(work, upstream))], upstream, "upstream")
        peers: dict[str, str] = {"direct": f"http://{HOST}:{upstream}"}
        port = free_port()
        spawn(["nginx", "-c", str(nginx_proxy_conf(work, port, upstream))], port, "nginx")
        peers["nginx"] = f"http://{HOST}:{port}"
        port = free_port()
        spawn(["haproxy", "-f", str(haproxy_conf(work, port, upstream))], port, "haproxy")
        peers["haproxy"] = f"http://{HOST}:{port}"
        config = work / "router.json"
        bench_router.write_config(config, upstream, pooled=False)
        port, metrics = free_port(), free_port()
        spawn([sys.executable, "-m", "sidecar", "--config", str(config), "--port", str(port),
               "--metrics-port", str(metrics)], port, "router", cwd=str(REPO),
              env={**os.environ, "PYTHONPATH": str(REPO), "MODELPOOL_LOG_LEVEL": "warning"})
        peers["modelpool router"] = f"http://{HOST}:{port}"
        if args.bare:
            port = free_port()
            spawn([sys.executable, str(HERE / "bare_proxy.py"), str(port),
                   f"http://{HOST}:{upstream}"], port, "bare")
            peers["bare loop"] = f"http://{HOST}:{port}"
            front["bare loop"] = "bare"
        if args.compare is not None:
            tree = str(args.compare.resolve())
            port, metrics = free_port(), free_port()
            spawn([sys.executable, "-m", "sidecar", "--config", str(config), "--port",
                   str(port), "--metrics-port", str(metrics)], port, "compared", cwd=tree,
                  env={**os.environ, "PYTHONPATH": tree, "MODELPOOL_LOG_LEVEL": "warning"})
            peers[f"router at {args.compare}"] = f"http://{HOST}:{port}"
            front[f"router at {args.compare}"] = "compared"
        if litellm is not None:
            port = free_port()
            # no master key: a loopback benchmark, as LiteLLM's local-development mode
            spawn([str(litellm), "--config", str(litellm_conf(work, upstream)), "--host", HOST,
                   "--port", str(port), "--num_workers", "1"], port, "litellm",
                  env={**os.environ, "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"})
            peers["LiteLLM proxy"] = f"http://{HOST}:{port}"
        script = work / "post.lua"
        script.write_text(f"wrk.method = 'POST'\nwrk.body = '{BODY}'\n"
                          "wrk.headers['Content-Type'] = 'application/json'\n")
        if args.bodies:
            peers.pop("LiteLLM proxy", None)
            sizes = [int(b) for b in args.bodies.split(",")]
            try:
                large_bodies(work, peers, sizes, args.rounds, args.seconds)
            finally:
                for process in processes:
                    process.terminate()
            return 0
        results: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        # CPU per request of the process in front (of the upstream, for direct): a
        # single-process proxy's capacity is its inverse, however busy the machine is.
        cpu_us: dict[tuple[str, int], list[float]] = defaultdict(list)
        try:
            for url in peers.values():  # warm each once
                wrk(f"{url}/v1/chat/completions", 1, 1.0, script)
            counters = bench_swap_kind.cpu_times()
            for round_ in range(args.rounds):
                order = list(peers.items())
                if round_ % 2:
                    order.reverse()
                for name, base in order:
                    for c in connections:
                        seconds = args.seconds if name != "LiteLLM proxy" else min(args.seconds, 5)
                        before = tree_cpu_seconds(pids[front[name]])
                        rps, p50 = wrk(f"{base}/v1/chat/completions", c, seconds, script)
                        used = tree_cpu_seconds(pids[front[name]]) - before
                        results[(name, c)].append((rps, p50))
                        cpu_us[(name, c)].append(used / (rps * seconds) * 1e6)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
    median: Callable[[list[float]], float] = statistics.median
    steal = bench_swap_kind.steal_percent(counters, bench_swap_kind.cpu_times())
    print(f"peers, {args.rounds} rounds alternated, wrk -t1, {args.seconds:g}s per run, "
          f"load average {os.getloadavg()[0]:.1f}, CPU steal {steal:.0f}%")
    header = " | ".join(f"{c} conn rps | {c} conn p50 | rps vs direct | rps vs nginx | "
                        f"{c} conn CPU per request | capacity vs nginx" for c in connections)
    print(f"| in front of the upstream | {header} |")
    print("| --- |" + " --- | --- | --- | --- | --- | --- |" * len(connections))
    for name in peers:
        cells = []
        for c in connections:
            rps = median([r for r, _ in results[(name, c)]])
            p50 = median([p for _, p in results[(name, c)]])
            direct = median([r for r, _ in results[("direct", c)]])
            nginx = median([r for r, _ in results[("nginx", c)]])
            cpu = median(cpu_us[(name, c)])
            capacity = median(cpu_us[("nginx", c)]) / cpu if cpu else float("nan")
            cells += [f"{rps:,.0f}", f"{p50:,.0f} us", f"{rps / direct:.2f}",
                      f"{rps / nginx:.2f}", f"{cpu:,.1f} us", f"{capacity:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("(CPU per request: user + system time of the process in front, its children "
          "included, over the requests wrk counted; capacity vs nginx: nginx's CPU per "
          "request over this one's, what one process of each could serve with a core to "
          "itself)")
    return 0


def large_bodies(work: Path, peers: dict[str, str], sizes: list[int], rounds: int,
                 seconds: float) -> None:
    """p50 latency at one connection for each prompt size, `model` first and last."""
    scripts = {(size, first): body_script(work, size, first)
               for size in sizes for first in (True, False)}
    results: dict[tuple[str, int, bool], list[tuple[float, float]]] = defaultdict(list)
    for url in peers.values():
        wrk(f"{url}/v1/chat/completions", 1, 1.0, scripts[(sizes[0], True)])
    for round_ in range(rounds):
        order = list(peers.items())
        if round_ % 2:
            order.reverse()
        for name, base in order:
            for (size, first), script in scripts.items():
                results[(name, size, first)].append(
                    wrk(f"{base}/v1/chat/completions", 1, seconds, script))
    print(f"large prompts, 1 connection, {rounds} rounds alternated, wrk -t1, {seconds:g}s "
          f"per run, load average {os.getloadavg()[0]:.1f}")
    columns = [(size, first) for size in sizes for first in (True, False)]
    print("| in front of the upstream | " + " | ".join(
        f"{size / 1e6:g} MB, model {'first' if first else 'last'}: p50 (added)"
        for size, first in columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for name in peers:
        cells = []
        for size, first in columns:
            p50 = statistics.median([p for _, p in results[(name, size, first)]])
            direct = statistics.median([p for _, p in results[("direct", size, first)]])
            added = "" if name == "direct" else f" (+{p50 - direct:,.0f})"
            cells.append(f"{p50:,.0f} us{added}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
