"""A ModelRouter's status as its Deployment and its backends' servers say it. Pure,
beside `pool_status` and `server_status`: the shell compares it with the object and
writes only what changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler import conditions as cond
from reconciler import scheduling
from reconciler.render import router_object_name
from reconciler.spec import ModelRouterSpec
from reconciler.timefmt import rfc3339


@dataclass(frozen=True)
class RouterStatus:
    owned: dict[str, Any]  # every status field the reconciler owns
    not_created: bool  # its Deployment's pods cannot be created


def router_status(
    spec: ModelRouterSpec,
    namespace: str,
    deployment: Mapping[str, Any],
    pools: Mapping[str, str | None],
    servers: Mapping[str, Mapping[str, Any]],
    previous: Mapping[str, Any] | None,
    now: float,
) -> RouterStatus:
    """The status of `spec`'s router, from its `deployment`, the pool holding each
    backend's server (`pools`, None when none or several do) and the status of each
    backend's server (`servers`, by name; absent when not seen)."""
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    wanted = spec.proxy.replicas
    phase = "Ready" if ready >= wanted else "Pending"
    backends = []
    for b in spec.backends:
        pool = pools.get(b.model_server_ref) if b.model_server_ref else None
        server = servers.get(b.model_server_ref or "") or {}
        backends.append({
            "name": b.name,
            "modelServer": b.model_server_ref,
            "pool": pool,
            "url": b.url,
            "phase": server.get("phase") if b.model_server_ref else "External",
            "ready": bool(b.url) or server.get("phase") == "Ready",
        })
    failure = None
    if phase == "Ready":
        ready_c = (True, "Ready", f"{ready}/{wanted} router pods Ready")
        reconciling = None
    else:
        ready_c = (False, "Pending", f"{ready}/{wanted} router pods Ready")
        reconciling = ("Pending", f"{ready}/{wanted} router pods Ready")
        failure = scheduling.creation_failure(deployment)
        if failure is not None:  # a pod that is not there cannot say why
            said = f"{ready}/{wanted} router pods Ready; one cannot be created: {failure}"
            ready_c = (False, scheduling.FAILED_CREATE, said)
            reconciling = (scheduling.FAILED_CREATE, said)
    owned = {
        "phase": phase,
        "endpoint": f"http://{router_object_name(spec.name)}.{namespace}.svc:{spec.proxy.port}",
        "backends": [{k: v for k, v in b.items() if v is not None} for b in backends],
        "observedGeneration": spec.generation,
        "conditions": cond.merge(
            (previous or {}).get("conditions"),
            cond.kstatus(ready=ready_c, reconciling=reconciling),
            now=rfc3339(now),
            observed_generation=spec.generation,
        ),
    }
    return RouterStatus(owned, failure is not None)
