"""Why the scheduler will not place a member's pod, in words a person can act on.

The scheduler says why on the pod (condition `PodScheduled`, reason `Unschedulable`):
"0/1 nodes are available: 1 Insufficient nvidia.com/gpu. ...". It does not say who holds
the resource. The reconciler sees the pods of every member it manages, so it names those
of them that hold the resource the message says is short; a holder it does not watch
(another workload) it cannot name, and says so. Pure functions of pod bodies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

UNSCHEDULABLE = "Unschedulable"  # the scheduler's reason, and the pool's
FAILED_CREATE = "FailedCreate"  # the ReplicaSet controller's reason, and the pool's


def refusal(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when it refused to place `pod`, else None."""
    status = pod.get("status") or {}
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for c in status.get("conditions") or []:
        refused = c.get("status") == "False" and c.get("reason") == UNSCHEDULABLE
        if c.get("type") == "PodScheduled" and refused:
            return str(c.get("message") or "no node fits")
    return None


def creation_failure(deployment: Mapping[str, Any]) -> str | None:
    """Why a Deployment's pods cannot be created (admission refused them: Pod Security, a
    quota, a missing ServiceAccount), as its `ReplicaFailure` condition says, else None.
    With no pod there is nothing for the scheduler to refuse, so this is the only trace."""
    for c in (deployment.get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return str(c.get("message") or c.get("reason") or FAILED_CREATE)
    return None


def creation_retry(last: float, now: float, every: float) -> tuple[bool, float]:
    """Whether a Deployment whose pods cannot be created is due for a retry of its own
    (`last`: when the reconciler last retried it, or first saw it fail), and the seconds
    until the retry after that. The ReplicaSet controller retries by itself only on a
    backoff that doubles from 5 ms to 1000 s and is reset by a success alone, so a pod
    refused for minutes would wait minutes more once the cause is gone."""
    if now - last >= every:
        return True, every
    return False, last + every - now


# A container waiting for one of these is on its way; any other reason is a failure the
# kubelet retries with backoff (CrashLoopBackOff, ImagePullBackOff, ErrImagePull,
# CreateContainerConfigError, ...), and a person has to look.
_STARTING = frozenset({"", "ContainerCreating", "PodInitializing"})


def container_failure(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a placed pod's container does not run, as the kubelet says it: its waiting
    reason, and a message with the kubelet's words and how the last run ended ("container
    model: back-off 20s restarting failed container ... (restarted 3 times; the last run
    exited 1, Error)"), else None."""
    status = pod.get("status") or {}
    for c in [*(status.get("initContainerStatuses") or []),
              *(status.get("containerStatuses") or [])]:
        waiting = (c.get("state") or {}).get("waiting")
        reason = str((waiting or {}).get("reason") or "")
        if waiting is None or reason in _STARTING:
            continue
        text = f"container {c.get('name')}: {reason}"
        if waiting.get("message"):
            text += f": {str(waiting['message']).strip()}"
        last = (c.get("lastState") or {}).get("terminated")
        restarts = int(c.get("restartCount") or 0)
        if last is not None:
            ended = f"exited {last.get('exitCode')}"
            if last.get("reason"):
                ended += f", {last['reason']}"
            if restarts:
                times = "once" if restarts == 1 else f"{restarts} times"
                ended = f"restarted {times}; the last run {ended}"
            text += f" ({ended})"
        return reason, text
    return None


def requests(pod: Mapping[str, Any], resource: str) -> int:
    """How much of `resource` the pod's containers ask for (limits count for extended
    resources, which need no request)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(resource)
        if amount is None:
            amount = (resources.get("requests") or {}).get(resource)
        try:
            total += int(str(amount)) if amount is not None else 0
        except ValueError:
            continue
    return total


def holders(pods: Iterable[Mapping[str, Any]], resource: str) -> list[str]:
    """`namespace/name on node` of the placed, unfinished pods that hold `resource`."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in ("Succeeded", "Failed") or requests(pod, resource) < 1:
            continue
        found.append(f"{meta.get('namespace')}/{meta.get('name')} on {node}")
    return sorted(found)


def explain(member: str, message: str, resource: str, held_by: list[str]) -> str:
    """One line: which member, what the scheduler said, and who holds what it lacks."""
    text = f"{member} cannot be scheduled: {message.strip()}"
    if f"Insufficient {resource}" not in message:
        return text
    if held_by:
        return f"{text} {resource} is held by {', '.join(held_by)}"
    return f"{text} {resource} is held by no pod that modelpool manages"
