"""`modelpool-local` as a person runs it: up prints the kubeconfig last, up twice is
harmless, status tells what runs, down stops everything and removes the state."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.local import controlplane, processes
from e2e.local.controlplane import NODE_AGENT, load_settings
from e2e.local.paths import StateLayout

pytestmark = pytest.mark.integration

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", NODE_AGENT)


def local(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "e2e.local", *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def alive(pid: int) -> bool:
    """A zombie (exited, not yet reaped) has an empty command line."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def test_up_twice_status_and_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    layout = StateLayout(state)
    try:
        first = local("up", "--state-dir", str(state), "--gpus", "2")
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip().splitlines()[-1] == str(layout.admin_kubeconfig)
        pids = {name: processes.running(layout.pid(name)) for name in COMPONENTS}
        assert all(pids.values()), pids
        settings = load_settings(layout)
        assert settings is not None and settings.gpus == 2
        kubectl = str(settings.bin_dir / "kubectl")

        again = local("up", "--state-dir", str(state), "--gpus", "2")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip().splitlines()[-1] == str(layout.admin_kubeconfig)
        assert {name: processes.running(layout.pid(name)) for name in COMPONENTS} == pids

        status = local("status", "--state-dir", str(state))
        assert status.returncode == 0, status.stdout
        assert "cluster: healthy" in status.stdout
        gpus = "jsonpath={.items[0].status.allocatable.nvidia\\.com/gpu}"
        nodes = subprocess.run(
            [kubectl, f"--kubeconfig={layout.admin_kubeconfig}", "get", "node", "-o", gpus],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert nodes.stdout == "2"
    finally:
        down = local("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    assert [name for name, pid in pids.items() if pid is not None and alive(pid)] == []

    after = local("status", "--state-dir", str(state))
    assert after.returncode == 1
    assert "no cluster" in after.stdout


class _SteppedClock:
    """time.monotonic plus a jump the stand-in build makes: the build 'takes' an hour."""

    def __init__(self) -> None:
        self.jump = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.jump


def test_up_deadline_starts_after_a_build_longer_than_it(tmp_path: Path) -> None:
    """A cold build takes minutes; the timeout covers starting and waiting only."""
    clock = _SteppedClock()
    bin_dir = controlplane.build_control_plane()

    def slow_build() -> Path:
        clock.jump += 3600.0
        return bin_dir

    state = tmp_path / "state"
    options = controlplane.UpOptions(
        state_dir=state,
        python=sys.executable,
        with_node=False,
        timeout=60.0,
        build=slow_build,
        clock=clock,
    )
    try:
        cluster = controlplane.up(options)
        assert clock.jump == 3600.0
        assert controlplane.healthy(cluster.state_dir) is not None
    finally:
        controlplane.down(state)

