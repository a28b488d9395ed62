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
