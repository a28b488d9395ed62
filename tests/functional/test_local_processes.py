"""Detached processes of `modelpool-local`: started in their own session, found again by
pid file, stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from e2e.local import controlplane, processes

pytestmark = pytest.mark.functional

SLEEP = shutil.which("sleep") or "/bin/sleep"


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_started_process_is_detached_and_tracked(tmp_path: Path) -> None:
    pid_file = tmp_path / "run" / "sleeper.pid"
    pid = processes.start([SLEEP, "60"], pid_file, tmp_path / "sleeper.log")
    try:
        assert processes.running(pid_file) == pid
        assert _parent(pid) != os.getpid()
        assert os.getsid(pid) == pid
    finally:
        assert processes.stop(pid_file, grace=5.0)
    assert processes.running(pid_file) is None
    assert not pid_file.exists()


def test_process_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "stubborn.pid"
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    processes.start([sys.executable, "-c", ignore], pid_file, tmp_path / "stubborn.log")
    assert processes.running(pid_file) is not None
    assert processes.stop(pid_file, grace=0.5)
    assert processes.running(pid_file) is None


def test_a_recycled_pid_is_not_taken_for_the_component(tmp_path: Path) -> None:
    pid_file = tmp_path / "other.pid"
    pid = processes.start([SLEEP, "60"], pid_file, tmp_path / "other.log")
    try:
        # The same binary started for another cluster: another command line.
        pid_file.with_suffix(".argv").write_text(f"{SLEEP}\x0061")
        assert processes.running(pid_file) is None
        pid_file.with_suffix(".argv").write_text(f"{SLEEP}\x0060")
        assert processes.running(pid_file) == pid
    finally:
        processes.stop(pid_file, grace=5.0)


def test_kill_under_ends_processes_working_in_the_directory(tmp_path: Path) -> None:
    work = tmp_path / "pods" / "p1"
    work.mkdir(parents=True)
    pid_file = tmp_path / "orphan.pid"
    pid = processes.start([SLEEP, "60"], pid_file, tmp_path / "orphan.log", cwd=work)
    assert processes.running(pid_file) == pid
    assert pid in processes.kill_under(tmp_path)
    processes.stop(pid_file, grace=5.0)
    assert processes.running(pid_file) is None


def test_down_leaves_a_directory_without_a_cluster_alone(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    pid_file = tmp_path / "bystander.pid"
    pid = processes.start([SLEEP, "60"], pid_file, tmp_path / "bystander.log", cwd=tmp_path)
    try:
        assert controlplane.down(tmp_path) is False
        assert processes.running(pid_file) == pid
        assert (tmp_path / "run").is_dir()
    finally:
        processes.stop(pid_file, grace=5.0)
