"""The scheduler's refusal of a member's pod, and who holds the GPU it lacks."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler import scheduling

pytestmark = pytest.mark.unit

GPU = "nvidia.com/gpu"
INSUFFICIENT = (
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
    "available: 1 No preemption victims found for incoming pod."
)


def pod(name: str, *, node: str | None = None, gpus: int = 1, phase: str = "Running",
        conditions: list[dict[str, Any]] | None = None, namespace: str = "demo") -> Any:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            **({"nodeName": node} if node else {}),
            "containers": [{"name": "server", "resources": {"limits": {GPU: str(gpus)}}}],
        },
        "status": {"phase": phase, "conditions": conditions or []},
    }


REFUSED = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": INSUFFICIENT}]


def test_a_refused_pod_gives_the_schedulers_message() -> None:
    assert scheduling.refusal(pod("b", phase="Pending", conditions=REFUSED)) == INSUFFICIENT


@pytest.mark.parametrize("body", [
    pod("b", phase="Pending"),  # not looked at yet
    pod("b", node="n1", conditions=REFUSED),  # placed since (a stale condition)
    pod("b", phase="Pending", conditions=[{**REFUSED[0], "reason": "SchedulingGated"}]),
    pod("b", phase="Pending", conditions=[{**REFUSED[0], "status": "True"}]),
])
def test_other_pods_are_not_refused(body: Any) -> None:
    assert scheduling.refusal(body) is None


def test_holders_are_the_placed_unfinished_pods_that_request_the_resource() -> None:
    pods = [
        pod("coder-1", node="local", namespace="modelpool-demo"),
        pod("gemma-1", phase="Pending", conditions=REFUSED),  # not placed
        pod("done-1", node="local", phase="Succeeded"),
        pod("cpu-1", node="local", gpus=0),
        pod("chat-2", node="gpu-2", namespace="team"),
    ]
    assert scheduling.holders(pods, GPU) == ["modelpool-demo/coder-1 on local",
                                             "team/chat-2 on gpu-2"]


def test_a_request_without_a_limit_counts_and_junk_does_not() -> None:
    body = pod("x", node="n")
    body["spec"]["containers"] = [
        {"resources": {"requests": {GPU: "2"}}},
        {"resources": {"limits": {GPU: "lots"}}},
    ]
    assert scheduling.requests(body, GPU) == 2


def test_the_explanation_names_the_holders_of_what_is_short() -> None:
    text = scheduling.explain("gemma", INSUFFICIENT, GPU, ["modelpool-demo/coder-1 on local"])
    assert text == (f"gemma cannot be scheduled: {INSUFFICIENT} "
                    "nvidia.com/gpu is held by modelpool-demo/coder-1 on local")
    none = scheduling.explain("gemma", INSUFFICIENT, GPU, [])
    assert none.endswith("nvidia.com/gpu is held by no pod that modelpool manages")
    other = scheduling.explain("gemma", "0/1 nodes are available: 1 node(s) had untolerated "
                               "taint.", GPU, ["x/y on n"])
    assert "held by" not in other


def _with_containers(*statuses: dict[str, Any], init: tuple[dict[str, Any], ...] = ()
                     ) -> dict[str, Any]:
    return {"spec": {"nodeName": "gpu-1"},
            "status": {"containerStatuses": list(statuses),
                       "initContainerStatuses": list(init)}}


def test_a_crash_looping_container_says_how_its_last_run_ended() -> None:
    pod = _with_containers({
        "name": "model", "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off 40s restarting failed container=model"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
    })
    assert scheduling.container_failure(pod) == (
        "CrashLoopBackOff",
        "container model: CrashLoopBackOff: back-off 40s restarting failed container=model "
        "(restarted 3 times; the last run exited 137, OOMKilled)")


def test_an_image_that_cannot_be_pulled_is_a_failure_and_a_starting_container_is_not() -> None:
    pulling = _with_containers({"name": "model", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "vllm/vllm:x"'}}})
    assert scheduling.container_failure(pulling) == (
        "ImagePullBackOff",
        'container model: ImagePullBackOff: Back-off pulling image "vllm/vllm:x"')
    for reason in ("ContainerCreating", "PodInitializing"):
        starting = _with_containers({"name": "model", "state": {"waiting": {"reason": reason}}})
        assert scheduling.container_failure(starting) is None
    first = _with_containers({"name": "model", "restartCount": 0, "state": {"waiting": {
        "reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 2}}})
    assert scheduling.container_failure(first) == (
        "CrashLoopBackOff", "container model: CrashLoopBackOff (exited 2)")
    running = _with_containers({"name": "model", "restartCount": 1,
                                "state": {"running": {}},
                                "lastState": {"terminated": {"exitCode": 1}}})
    assert scheduling.container_failure(running) is None
    assert scheduling.container_failure({"status": {}}) is None


def test_an_init_container_that_fails_is_named() -> None:
    pod = _with_containers(
        {"name": "model", "state": {"waiting": {"reason": "PodInitializing"}}},
        init=({"name": "fetch", "restartCount": 1,
               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}},))
    assert scheduling.container_failure(pod) == (
        "CrashLoopBackOff",
        "container fetch: CrashLoopBackOff (restarted once; the last run exited 2, Error)")


def test_a_deployment_that_cannot_create_its_pods_is_retried_once_a_period() -> None:
    every = 10.0
    # first seen failing at 100: its controller has just tried, so not yet
    assert scheduling.creation_retry(100.0, 100.0, every) == (False, 10.0)
    assert scheduling.creation_retry(100.0, 104.0, every) == (False, 6.0)
    # a period on: due, and the next a whole period after this one
    assert scheduling.creation_retry(100.0, 110.0, every) == (True, 10.0)
    assert scheduling.creation_retry(100.0, 131.5, every) == (True, 10.0)
