"""Where a machine's CPU goes while something runs: CPU seconds by kind of process.

    .venv/bin/python benchmarks/cpu_by_command.py --out /tmp/cpu.txt &   # then run the thing
    kill %1                                                              # prints the table

Every `--interval` seconds it reads each process's user and system time (/proc/PID/stat)
and adds what it used since the last reading to the process's kind (the first of
`KINDS` its command line matches, else its program's name). A process that lived less than
one interval, or used CPU after its last reading, is not seen by name: the table's
`unattributed` row is the machine's busy time (/proc/stat) that no reading accounts for
(short-lived `kubectl` and `docker` calls, mostly). On SIGINT or SIGTERM it prints the
table, the most CPU first, and writes it to `--out` when given.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
# (kind, what its command line holds), first match wins.
KINDS = (
    ("llama-server (real)", "llama-server"),
    ("fake model server", "e2e.fake_model"),
    ("fake model server", "modelpool-fake-model"),
    ("router", "modelpool-router"),
    ("router", "-m sidecar"),
    ("reconciler", "modelpool-reconciler"),
    ("reconciler", "-m reconciler"),
    ("local node agent", "e2e.local.node_agent"),
    ("pytest", "pytest"),
    ("pytest", "exec(eval(sys.stdin.readline()))"),
    ("mypy", "mypy"),
    ("kind: kube-apiserver", "kube-apiserver --advertise-address=172."),
    ("local: kube-apiserver", "kube-apiserver"),
    ("kind: etcd", "etcd --advertise-client-urls"),
    ("local: etcd", "etcd"),
    ("kind: controller-manager", "kube-controller-manager --allocate-node-cidrs"),
    ("local: controller-manager", "kube-controller-manager"),
    ("scheduler", "kube-scheduler"),
    ("kind: kubelet", "kubelet"),
    ("kind: containerd and shims", "containerd"),
    ("docker", "dockerd"),
    ("kind: flannel, kube-router, kube-proxy, coredns",
     ("flanneld", "kube-router", "kube-proxy", "coredns")),
    ("flux, prometheus, argocd", ("flux", "prometheus", "argocd", "source-controller",
                                  "kustomize-controller")),
)


def kind_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "gone"
    line = raw.replace(b"\0", b" ").decode(errors="replace")
    for name, needle in KINDS:
        needles = needle if isinstance(needle, tuple) else (needle,)
        if any(n in line for n in needles):
            return name
    program = line.split(" ", 1)[0]
    return os.path.basename(program) or "kernel threads"


def used(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def busy() -> float:
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in cpu[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    seen: dict[int, tuple[str, float]] = {}
    totals: dict[str, float] = defaultdict(float)
    began, busy_began = time.monotonic(), busy()
    stop = False

    def ask_stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, ask_stop)
    signal.signal(signal.SIGTERM, ask_stop)
    first = True
    while not stop:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            now = used(pid)
            if now is None:
                continue
            kind, before = seen.get(pid) or (kind_of(pid), now if first else 0.0)
            totals[kind] += now - before
            seen[pid] = (kind, now)
        first = False
        time.sleep(args.interval)
    wall = time.monotonic() - began
    machine = busy() - busy_began
    attributed = sum(totals.values())
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    lines = [f"{wall:.0f} s of wall time, {os.cpu_count()} CPUs: {machine:.0f} CPU seconds busy "
             f"({machine / wall:.2f} CPUs on average)",
             f"{'kind of process':<48} {'CPU s':>8} {'share':>6}"]
    for kind, seconds in rows:
        if seconds >= 1:
            lines.append(f"{kind:<48} {seconds:8.0f} {seconds / machine:6.1%}")
    lines.append(f"{'unattributed':<48} {machine - attributed:8.0f} "
                 f"{(machine - attributed) / machine:6.1%}")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
