"""Bring a local cluster up, report on it, take it down.

A cluster is a state directory (see `paths`) plus the processes its pid files track.
`up` is idempotent: it starts only what is not running, reuses the ports, certificates
and etcd data it finds, and waits until the cluster can run a pod. `down` stops the node
agent first, so its pods get their SIGTERM, then the control plane, and removes the
directory.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from e2e.local import certs, components, kubeconfig, processes
from e2e.local.components import ClusterSettings, Component, Ports
from e2e.local.health import ApiProbe, serving_healthy
from e2e.local.paths import BUILD_SCRIPT, REPO_ROOT, StateLayout

log = logging.getLogger(__name__)

NODE_AGENT = "node-agent"
# The node agent stops its pods within their grace periods before it exits.
NODE_AGENT_GRACE = 45.0
CONTROL_PLANE_GRACE = 10.0


class ClusterError(Exception):
    """The cluster could not be brought up; the message says which part and where its log is."""


@dataclass(frozen=True)
class UpOptions:
    state_dir: Path
    python: str
    gpus: int = 1
    with_node: bool = True
    bin_dir: Path | None = None
    # Seconds to start what is not running and become healthy, counted once the
    # binaries are there: a cold build (minutes) never eats into it.
    timeout: float = 180.0
    # Restart a running node agent (to pick up a change to its code).
    restart_node: bool = False
    # Where the binaries come from when `bin_dir` is not given (the build script).
    build: Callable[[], Path] | None = None
    # The clock of the deadline; tests inject one.
    clock: Callable[[], float] = time.monotonic
    # The controller manager's and scheduler's client rate limit (components.ClusterSettings).
    api_qps: int | None = None


@dataclass(frozen=True)
class LocalCluster:
    """A running cluster, as tests and people use it."""

    state_dir: Path
    settings: ClusterSettings

    @property
    def layout(self) -> StateLayout:
        return StateLayout(self.state_dir)

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def bin_dir(self) -> Path:
        return self.settings.bin_dir

    @property
    def node_state_dir(self) -> Path:
        return self.layout.node_state


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None


def build_control_plane() -> Path:
    """Run the build script (a warm cache returns at once); its progress goes to stderr."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ClusterError(f"{BUILD_SCRIPT} failed (exit {result.returncode})")
    return Path(lines[-1])


def _free_ports(count: int) -> list[int]:
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _new_ports() -> Ports:
    etcd_client, etcd_peer, apiserver, controller_manager, scheduler = _free_ports(5)
    return Ports(etcd_client, etcd_peer, apiserver, controller_manager, scheduler)


def load_settings(layout: StateLayout) -> ClusterSettings | None:
    try:
        return ClusterSettings.from_json(layout.config.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_kubeconfigs(layout: StateLayout, settings: ClusterSettings) -> None:
    ca = layout.cert("ca").read_bytes()
    for name, identity in certs.CLIENTS.items():
        text = kubeconfig.render(
            settings.server,
            ca,
            identity.common_name,
            layout.cert(name).read_bytes(),
            layout.key(name).read_bytes(),
        )
        path = layout.admin_kubeconfig if name == "admin" else layout.kubeconfig(name)
        kubeconfig.write(path, text)


def _ensure_running(layout: StateLayout, component: Component, cwd: Path) -> bool:
    """Start `component` unless it runs; return whether it was started now."""
    pid_file = layout.pid(component.name)
    if processes.running(pid_file) is not None:
        return False
    try:
        pid = processes.start(component.argv, pid_file, layout.log(component.name), cwd=cwd)
    except RuntimeError as e:
        raise ClusterError(f"{e}; last lines:\n{_tail(layout.log(component.name))}") from e
    log.info("started %s (pid %s, log %s)", component.name, pid, layout.log(component.name))
    return True


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class _Deadline:
    """The time `up` may take to start and wait, and what it tells the user meanwhile."""

    clock: Callable[[], float]
    started_at: float
    timeout: float
    # A wait longer than this says what it waits for, and again every so often.
    report_every: float = 5.0
    sleep: Callable[[float], None] = time.sleep

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def passed(self) -> bool:
        return self.elapsed() > self.timeout


def _wait(
    layout: StateLayout,
    what: str,
    check: Callable[[], bool],
    watched: list[str],
    deadline: _Deadline,
) -> None:
    """Poll `check` until it holds; fail at once if a watched component has exited.

    A wait that lasts more than a few seconds says what it waits for and how much of the
    deadline is spent, so a slow start is never silent.
    """
    began = deadline.clock()
    next_report = began + deadline.report_every
    while True:
        if check():
            return
        for name in watched:
            if processes.running(layout.pid(name)) is None:
                raise ClusterError(
                    f"{name} exited while waiting for {what}; last lines of "
                    f"{layout.log(name)}:\n{_tail(layout.log(name))}"
                )
        if deadline.passed():
            raise ClusterError(
                f"timed out after {deadline.timeout:.0f}s waiting for {what}; "
                f"logs are in {layout.logs}"
            )
        now = deadline.clock()
        if now >= next_report:
            log.info(
                "waiting for %s: %.0fs so far, %.0fs of the %.0fs deadline spent",
                what, now - began, deadline.elapsed(), deadline.timeout,
            )
            next_report = now + deadline.report_every
        deadline.sleep(0.25)


def up(options: UpOptions) -> LocalCluster:
    """Start whatever of the cluster is not running and wait until it is healthy."""
    layout = StateLayout(options.state_dir.resolve())
    layout.root.mkdir(parents=True, exist_ok=True)
    bin_dir = options.bin_dir or (options.build or build_control_plane)()
    deadline = _Deadline(options.clock, options.clock(), options.timeout)
    previous = load_settings(layout)
    node_running = processes.running(layout.pid(NODE_AGENT)) is not None
    settings = ClusterSettings(
        bin_dir=bin_dir,
        ports=previous.ports if previous else _new_ports(),
        gpus=options.gpus,
        pod_network=previous.pod_network if previous else components.random_pod_network(),
        with_node=options.with_node or node_running,
        api_qps=options.api_qps,
    )
    certs.ensure_pki(layout, dt.datetime.now(dt.UTC))
    _write_kubeconfigs(layout, settings)
    layout.config.write_text(settings.to_json())

    etcd, apiserver, controller_manager, scheduler = components.control_plane(layout, settings)
    _ensure_running(layout, etcd, layout.root)
    _ensure_running(layout, apiserver, layout.root)
    probe = ApiProbe(layout, settings.server)
    _wait(layout, "the API server", probe.ready, [etcd.name, apiserver.name], deadline)
    log.info("API server ready after %.1fs", deadline.elapsed())

    _ensure_running(layout, controller_manager, layout.root)
    _ensure_running(layout, scheduler, layout.root)
    watched = [c.name for c in (etcd, apiserver, controller_manager, scheduler)]
    if settings.with_node:
        _ensure_node_agent(layout, settings, options, previous)
        watched.append(NODE_AGENT)

    ports = settings.ports
    _wait(
        layout,
        "the controller manager",
        lambda: serving_healthy(ports.controller_manager),
        watched,
        deadline,
    )
    _wait(layout, "the scheduler", lambda: serving_healthy(ports.scheduler), watched, deadline)
    _wait(
        layout,
        "the default ServiceAccount",
        lambda: probe.service_account_exists("default", "default"),
        watched,
        deadline,
    )
    if settings.with_node:
        _wait(
            layout,
            f"node {settings.node_name} to be Ready",
            lambda: probe.node_ready(settings.node_name),
            watched,
            deadline,
        )
    log.info("cluster healthy after %.1fs", deadline.elapsed())
    return LocalCluster(layout.root, settings)


def _ensure_node_agent(
    layout: StateLayout,
    settings: ClusterSettings,
    options: UpOptions,
    previous: ClusterSettings | None,
) -> None:
    pid_file = layout.pid(NODE_AGENT)
    gpus_changed = previous is not None and previous.gpus != settings.gpus
    if (gpus_changed or options.restart_node) and processes.running(pid_file):
        log.info("restarting the node agent (%s GPUs)", settings.gpus)
        processes.stop(pid_file, NODE_AGENT_GRACE)
    agent = components.node_agent(layout, settings, options.python)
    _ensure_running(layout, agent, REPO_ROOT)


def healthy(state_dir: Path) -> LocalCluster | None:
    """The cluster in `state_dir` if every part of it runs and it is ready, else None."""
    layout = StateLayout(state_dir.resolve())
    settings = load_settings(layout)
    if settings is None:
        return None
    names = [c.name for c in components.control_plane(layout, settings)]
    if settings.with_node:
        names.append(NODE_AGENT)
    if any(processes.running(layout.pid(name)) is None for name in names):
        return None
    probe = ApiProbe(layout, settings.server)
    if not probe.ready():
        return None
    if settings.with_node and not probe.node_ready(settings.node_name):
        return None
    return LocalCluster(layout.root, settings)


def status(state_dir: Path) -> list[ComponentStatus]:
    layout = StateLayout(state_dir.resolve())
    settings = load_settings(layout)
    if settings is None:
        return []
    names = [c.name for c in components.control_plane(layout, settings)]
    names.append(NODE_AGENT)
    return [ComponentStatus(name, processes.running(layout.pid(name))) for name in names]


def down(state_dir: Path) -> bool:
    """Stop everything of the cluster in `state_dir` and remove the directory.

    Returns False (and removes nothing) when `state_dir` holds no cluster.
    """
    layout = StateLayout(state_dir.resolve())
    # cluster.json is written before any process starts: without it nothing here is ours
    # (and `--state-dir` may name a directory that must not be swept or removed).
    if not layout.config.is_file():
        return False
    processes.stop(layout.pid(NODE_AGENT), NODE_AGENT_GRACE)
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        if processes.stop(layout.pid(name), CONTROL_PLANE_GRACE):
            log.info("stopped %s", name)
    leftovers = processes.kill_under(layout.root)
    if leftovers:
        log.warning("killed %d leftover processes under %s", len(leftovers), layout.root)
    shutil.rmtree(layout.root, ignore_errors=True)
    return True

