"""A ModelServer's status as its pods and its Deployment say it. Pure: the shell compares
it with the object and writes only what changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler import conditions as cond
from reconciler import scheduling
from reconciler.objects import pod_active, pod_ready
from reconciler.spec import ModelServerSpec
from reconciler.timefmt import rfc3339


@dataclass(frozen=True)
class ServerStatus:
    owned: dict[str, Any]  # every status field the reconciler owns
    stalled: tuple[str, str] | None  # (reason, message) when Stalled
    not_created: bool  # its Deployment's pods cannot be created (none runs)


def server_status(
    spec: ModelServerSpec,
    replicas: int,
    pool: str | None,
    ambiguous: bool,
    pods: Sequence[Mapping[str, Any]],
    deployment: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    now: float,
) -> ServerStatus:
    """The status of `spec`'s server run at `replicas` by `pool` (`ambiguous`: it is a
    member of more than one), from its `pods` and its `deployment`."""
    name, namespace = spec.name, spec.namespace
    active = [p for p in pods if pod_active(p)]
    ready = sum(1 for p in active if pod_ready(p))
    failed = any((p.get("status") or {}).get("phase") == "Failed" for p in pods)
    if ready > 0:
        phase = "Ready"
    elif replicas == 0 and not active:
        phase = "Stopped"
    elif failed and not active:
        phase = "Failed"
    elif any((p.get("spec") or {}).get("nodeName") for p in active):
        phase = "Loading"
    else:
        phase = "Pending"
    stalled = ("MemberOfTwoPools", f"{name} is a member of more than one pool") \
        if ambiguous else None
    failure = None
    if phase in ("Ready", "Stopped"):
        why = "a pod is Ready" if phase == "Ready" else "stopped by its pool"
        ready_c = (True, phase, why)
        reconciling = None
    else:
        ready_c = (False, phase, f"{ready}/{replicas} pods Ready")
        reconciling = (phase, f"{ready}/{replicas} pods Ready")
        failure = None if active else scheduling.creation_failure(deployment)
        if failure is not None:  # no pod to show why: its Deployment says
            ready_c = (False, scheduling.FAILED_CREATE, f"{name} cannot be created: {failure}")
            reconciling = (scheduling.FAILED_CREATE, ready_c[2])
        stuck = next((f for f in map(scheduling.container_failure, active) if f), None)
        if stuck is not None:  # the kubelet cannot run a container
            reconciling = (stuck[0], f"{name} is not starting: {stuck[1]}")
            ready_c = (False, *reconciling)
    owned = {
        "phase": phase,
        "replicas": replicas,
        "readyReplicas": ready,
        "endpoint": f"http://{name}.{namespace}.svc:{spec.port}",
        "pool": pool,
        "networkPolicy": None if spec.allow_direct_access else name,
        "observedGeneration": spec.generation,
        "conditions": cond.merge(
            (previous or {}).get("conditions"),
            cond.kstatus(ready=ready_c, reconciling=reconciling, stalled=stalled),
            now=rfc3339(now),
            observed_generation=spec.generation,
        ),
    }
    return ServerStatus(owned, stalled, failure is not None)
