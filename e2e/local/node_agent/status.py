"""The pod status the agent reports, computed from what its processes are doing.

Pure: the shell describes each container (`ContainerRuntime`) and gets back the
`status` body to send to the pods/status subresource. The result is deterministic for
the same inputs (transition times carry over from the previous status), so the shell
writes only when it differs from what it wrote last and an idle cluster stays quiet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from e2e.local.node_agent.podspec import Json


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str
    started_at: str
    finished_at: str
    container_id: str
    message: str = ""
    signal: int | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        }
        if self.message:
            out["message"] = self.message
        if self.signal is not None:
            out["signal"] = self.signal
        return out


@dataclass(frozen=True)
class ContainerRuntime:
    """One container as the shell sees it. `state` is waiting, running or terminated;
    a terminated container is described by `terminated`."""

    name: str
    image: str
    image_id: str
    state: str = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str = ""
    container_id: str = ""
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False

    def body(self) -> dict[str, Any]:
        state: dict[str, Any]
        if self.state == "running":
            state = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated" and self.terminated is not None:
            state = {"terminated": self.terminated.body()}
        else:
            waiting: dict[str, Any] = {"reason": self.reason}
            if self.message:
                waiting["message"] = self.message
            state = {"waiting": waiting}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": (
                {"terminated": self.last_terminated.body()} if self.last_terminated else {}
            ),
        }
        container_id = self.container_id or (
            self.terminated.container_id if self.terminated else ""
        )
        if container_id:
            out["containerID"] = container_id
        return out


def phase(restart_policy: str, containers: Sequence[ContainerRuntime]) -> str:
    """The kubelet's phase rule (pkg/kubelet getPhase) for regular containers."""
    running = waiting = stopped = failed = 0
    for container in containers:
        if container.state == "running":
            running += 1
        elif container.state == "terminated":
            stopped += 1
            if container.terminated is not None and container.terminated.exit_code != 0:
                failed += 1
        elif container.last_terminated is not None:
            stopped += 1
            if container.last_terminated.exit_code != 0:
                failed += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if restart_policy == "OnFailure":
        return "Running" if failed else "Succeeded"
    return "Failed" if failed else "Succeeded"


def _condition(
    kind: str, ok: bool, previous: Mapping[str, Json], now: str, reason: str = "", message: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind)
    since = before["lastTransitionTime"] if before and before.get("status") == status else now
    out: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since,
    }
    if not ok and reason:
        out["reason"] = reason
    if not ok and message:
        out["message"] = message
    return out


@dataclass(frozen=True)
class PodFailure:
    """A pod-level failure the agent decided (an unknown image)."""

    reason: str
    message: str


def pod_status(
    pod: Json,
    containers: Sequence[ContainerRuntime],
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
    failure: PodFailure | None = None,
    init_containers: Sequence[ContainerRuntime] = (),
) -> dict[str, Any]:
    """The `status` body for the pods/status subresource. Until every init container
    has completed the pod is Pending and not Initialized."""
    spec = pod.get("spec", {})
    previous = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    incomplete = [
        c.name
        for c in init_containers
        if c.state != "terminated" or c.terminated is None or c.terminated.exit_code != 0
    ]
    if failure is not None:
        pod_phase = "Failed"
    elif incomplete:
        pod_phase = "Pending"
    else:
        pod_phase = phase(spec.get("restartPolicy", "Always"), containers)
    terminal = pod_phase in ("Failed", "Succeeded")
    unready = [c.name for c in containers if not c.ready]
    all_ready = not unready and not terminal
    gates_ok = all(
        previous.get(gate["conditionType"], {}).get("status") == "True"
        for gate in spec.get("readinessGates") or []
    )
    if terminal:
        reason, message = "PodCompleted", ""
    else:
        reason = "ContainersNotReady"
        message = f"containers with unready status: [{' '.join(unready)}]"
    conditions = [
        _condition("PodReadyToStartContainers", True, previous, now),
        _condition(
            "Initialized",
            not incomplete,
            previous,
            now,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(incomplete)}]",
        ),
        _condition("Ready", all_ready and gates_ok, previous, now, reason, message),
        _condition("ContainersReady", all_ready, previous, now, reason, message),
        _condition("PodScheduled", True, previous, now),
    ]
    if "PodScheduled" in previous:
        conditions[-1] = dict(previous["PodScheduled"])
    status: dict[str, Any] = {
        "phase": pod_phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.body() for c in containers],
    }
    generation = (pod.get("metadata") or {}).get("generation")
    if generation is not None:
        status["observedGeneration"] = generation
    if init_containers:
        status["initContainerStatuses"] = [c.body() for c in init_containers]
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if failure is not None:
        status["reason"] = failure.reason
        status["message"] = failure.message
    return status
