"""Pod phase, conditions and container statuses."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.local.node_agent.node import event_body
from e2e.local.node_agent.restarts import backoff_seconds, should_restart
from e2e.local.node_agent.status import (
    ContainerRuntime,
    PodFailure,
    Terminated,
    phase,
    pod_status,
)

pytestmark = pytest.mark.unit

T0 = "2026-11-30T10:00:00Z"
T1 = "2026-11-30T10:00:05Z"


def done(code: int) -> Terminated:
    return Terminated(exit_code=code, reason="Completed" if code == 0 else "Error",
                      started_at=T0, finished_at=T1, container_id="local://1")


def rt(state: str = "waiting", **kw: Any) -> ContainerRuntime:
    return ContainerRuntime(name=kw.pop("name", "c"), image="modelpool/fake-model",
                            image_id="local://modelpool/fake-model", state=state, **kw)


@pytest.mark.parametrize(
    ("policy", "containers", "expected"),
    [
        ("Always", [rt()], "Pending"),
        ("Always", [rt("running")], "Running"),
        ("Always", [rt("running"), rt()], "Pending"),
        ("Always", [rt(last_terminated=done(1))], "Running"),
        ("Never", [rt("terminated", terminated=done(0))], "Succeeded"),
        ("Never", [rt("terminated", terminated=done(2))], "Failed"),
        ("Never", [rt("terminated", terminated=done(0)), rt("running")], "Running"),
        ("OnFailure", [rt("terminated", terminated=done(0))], "Succeeded"),
        ("OnFailure", [rt(last_terminated=done(1))], "Running"),
        ("Always", [rt("terminated", terminated=done(0))], "Running"),
    ],
)
def test_phase(policy: str, containers: list[ContainerRuntime], expected: str) -> None:
    assert phase(policy, containers) == expected


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns"},
    "spec": {"containers": [{"name": "c"}], "restartPolicy": "Always"},
    "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                               "lastTransitionTime": "2026-11-30T09:00:00Z"}]},
}


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_running_ready_pod() -> None:
    container = rt("running", started_at=T0, ready=True, started=True,
                   container_id="local://42", restart_count=2, last_terminated=done(1))
    status = pod_status(POD, [container], "127.0.1.1", "127.0.0.1", T0, T1)
    assert status["phase"] == "Running"
    assert conditions(status) == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert status["podIP"] == "127.0.1.1"
    assert status["podIPs"] == [{"ip": "127.0.1.1"}]
    assert status["hostIP"] == "127.0.0.1"
    assert status["startTime"] == T0
    [cs] = status["containerStatuses"]
    assert cs["state"] == {"running": {"startedAt": T0}}
    assert cs["ready"] is True and cs["started"] is True
    assert cs["restartCount"] == 2
    assert cs["containerID"] == "local://42"
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    scheduled = next(c for c in status["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["lastTransitionTime"] == "2026-11-30T09:00:00Z"


def test_unready_container_names_itself() -> None:
    status = pod_status(POD, [rt("running", started_at=T0)], "127.0.1.1", "127.0.0.1", T0, T1)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == "ContainersNotReady"
    assert ready["message"] == "containers with unready status: [c]"


def test_same_inputs_give_the_same_body_later() -> None:
    first = pod_status(POD, [rt("running", started_at=T0)], "127.0.1.1", "127.0.0.1", T0, T0)
    basis = {**POD, "status": first}
    again = pod_status(basis, [rt("running", started_at=T0)], "127.0.1.1", "127.0.0.1", T0, T1)
    assert again == first


def test_transition_time_moves_only_on_change() -> None:
    first = pod_status(POD, [rt("running", started_at=T0)], "127.0.1.1", "127.0.0.1", T0, T0)
    basis = {**POD, "status": first}
    ready = rt("running", started_at=T0, ready=True, started=True)
    later = pod_status(basis, [ready], "127.0.1.1", "127.0.0.1", T0, T1)
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times["Ready"] == T1
    assert times["Initialized"] == T0


def test_unknown_image_fails_the_pod_with_a_reason() -> None:
    container = rt(reason="UnknownImage", message='image "busybox" is not known')
    failure = PodFailure(reason="UnknownImage", message='image "busybox" is not known')
    status = pod_status(POD, [container], "127.0.1.1", "127.0.0.1", T0, T1, failure)
    assert status["phase"] == "Failed"
    assert status["reason"] == "UnknownImage"
    assert "busybox" in status["message"]
    [cs] = status["containerStatuses"]
    assert cs["state"]["waiting"]["reason"] == "UnknownImage"
    assert "busybox" in cs["state"]["waiting"]["message"]
    assert conditions(status)["Ready"] == "False"


def test_terminated_container_shows_exit_code_and_signal() -> None:
    killed = Terminated(exit_code=137, reason="Error", started_at=T0, finished_at=T1,
                        container_id="local://9", signal=9)
    pod = {**POD, "spec": {**POD["spec"], "restartPolicy": "Never"}}
    status = pod_status(pod, [rt("terminated", terminated=killed)], "127.0.1.1", "127.0.0.1",
                        T0, T1)
    assert status["phase"] == "Failed"
    [cs] = status["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 137
    assert cs["state"]["terminated"]["signal"] == 9
    assert cs["containerID"] == "local://9"


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [("Always", 0, True), ("Always", 1, True), ("OnFailure", 0, False),
     ("OnFailure", 3, True), ("Never", 1, False), ("Never", 0, False)],
)
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    assert should_restart(policy, code) is restart


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_seconds(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_pod_is_pending_and_not_initialized_until_init_containers_complete() -> None:
    init_running = rt("running", name="init", started_at=T0)
    main = rt(name="c", reason="PodInitializing")
    status = pod_status(POD, [main], "127.0.1.1", "127.0.0.1", T0, T1,
                        init_containers=[init_running])
    assert status["phase"] == "Pending"
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False"
    assert initialized["message"] == "containers with incomplete status: [init]"
    assert status["initContainerStatuses"][0]["state"] == {"running": {"startedAt": T0}}
    assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"

    init_done = rt("terminated", name="init", terminated=done(0))
    status = pod_status(POD, [rt("running", started_at=T1)], "127.0.1.1", "127.0.0.1", T0, T1,
                        init_containers=[init_done])
    assert status["phase"] == "Running"
    assert conditions(status)["Initialized"] == "True"


def test_no_init_containers_no_init_statuses() -> None:
    status = pod_status(POD, [rt("running", started_at=T0)], "127.0.1.1", "127.0.0.1", T0, T1)
    assert "initContainerStatuses" not in status


def test_event_body_names_the_pod_and_the_node() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    event = event_body(pod, "node-a", "Warning", "Failed", "x" * 2000, 0.0)
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p",
                                       "namespace": "ns", "uid": "u"}
    assert event["metadata"] == {"generateName": "p.", "namespace": "ns"}
    assert (event["type"], event["reason"]) == ("Warning", "Failed")
    assert event["source"] == {"component": "kubelet", "host": "node-a"}
    assert len(event["message"]) == 1000
