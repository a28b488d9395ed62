"""GitOps judged by Argo CD itself: its application controller and repo server (built from
the Go module proxy by e2e/argocd/build.sh, with Debian's Redis) sync modelpool and the
examples from a git repository of this checkout, with `ServerSideApply=true` and automated
sync; the pool swaps back and forth through the router, and after each swap a hard refresh
finds both Applications Synced (every resource) and Healthy, by Argo CD's own diff and by
the health checks of e2e/argocd/install.yaml (what a user writes), with no sync run since
the first. Then `managedFields`: no manager but Argo CD's owns a `spec` field of a
ModelServer, ModelPool or ModelRouter, and the reconciler writes only through `status`.

Flux judges the same on kind (e2e/kind_tests/test_flux.py). This module stays on the local
testbed: Argo CD runs here as processes beside the cluster (as Argo CD's own e2e setup runs
it), and the cluster-wide reconciler of the base that it installs would act on every
namespace of a shared cluster; so it runs on a cluster of its own (this module's `cluster`
fixture overrides the shared one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.argocd import local as argocd
from e2e.local import fixtures as local_fixtures
from e2e.local.fixtures import Kubectl

GIT_MANAGER = "argocd-controller"
RECONCILER_MANAGER = "modelpool-reconciler"
OWN_KINDS = ("ModelServer", "ModelPool", "ModelRouter")
NAMESPACE = "modelpool-demo"  # the examples' own (examples/kustomization.yaml)
POOL = "gpu0"
ROUTER = "chat"
# The example pool's members, in the order the test swaps to them (gemma is the default).
SWAPS = ("qwen", "gemma", "qwen")
SWAP_SECONDS = 60.0

Json = dict[str, Any]

# Documents and comparisons (pure)


def key_of(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"])


def spec_owners(obj: Mapping[str, Any]) -> list[str]:
    """The managers (and how they wrote) that own any field under `spec`."""
    return [
        f"{entry.get('manager')} ({entry.get('operation')}, "
        f"{entry.get('subresource') or 'main resource'})"
        for entry in (obj.get("metadata") or {}).get("managedFields") or []
        if "f:spec" in (entry.get("fieldsV1") or {})
    ]


def status_writers(obj: Mapping[str, Any]) -> set[str]:
    return {
        str(entry.get("manager"))
        for entry in (obj.get("metadata") or {}).get("managedFields") or []
        if entry.get("subresource") == "status"
    }


# The live test


def _live(kubectl: Kubectl, obj: Mapping[str, Any]) -> Json:
    kind, namespace, name = key_of(obj)
    group = str(obj["apiVersion"]).split("/")[0] if "/" in obj["apiVersion"] else ""
    resource = f"{kind.lower()}.{group}" if group else kind.lower()
    args = ["get", resource, name, "--show-managed-fields"]
    if namespace:
        args += ["-n", namespace]
    result: Json = kubectl.json(*args)
    return result


def _swap_through_router(kubectl: Kubectl, namespace: str, model: str) -> None:
    (pod,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=60.0)
    client = openai.OpenAI(
        base_url=harness.base_url(pod), api_key="unused", max_retries=0, timeout=SWAP_SECONDS
    )
    try:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.choices[0].message.content, f"{model} answered nothing"
        # The reply can come before the status says so (the router probes the target).
        pool = harness.wait_pool_ready(kubectl, namespace, POOL, resident=model, within=10)
        assert pool["status"].get("residentMember") == model, pool["status"]
    finally:
        client.close()


# A cluster of the test's own, whatever MODELPOOL_REUSE_CLUSTER says (see above). On kind
# the cluster-wide reconciler of overlays/kind already acts on every namespace, so this
# module, which installs and removes the base's own, stays on the local testbed.
TESTBED = "local"
cluster = local_fixtures.private_cluster("gitops-cluster")
# Argo CD's controllers: scripts/test builds them while the other tests run.
pytestmark = pytest.mark.build("argocd")


@pytest.fixture
def argo(kubectl: Kubectl, tmp_path: Path) -> Iterator[argocd.ArgoCD]:
    with argocd.started(kubectl, tmp_path) as running:
        yield running


def synced_and_healthy(app: Json) -> str | None:
    """What keeps the Application from reading Synced and Healthy at its revision (None
    when nothing does)."""
    status = app.get("status") or {}
    sync, health = status.get("sync") or {}, status.get("health") or {}
    unsynced = [(r["kind"], r["name"], r.get("status")) for r in status.get("resources", [])
                if r.get("status") != "Synced"]
    if sync.get("status") != "Synced" or unsynced:
        return f"sync {sync.get('status')}: {unsynced}; {status.get('conditions')}"
    if health.get("status") != "Healthy":
        sick = [(r["kind"], r["name"], r.get("health")) for r in status.get("resources", [])
                if (r.get("health") or {}).get("status", "Healthy") != "Healthy"]
        return f"health {health.get('status')}: {sick}"
    return None


def wait_synced_and_healthy(argo: argocd.ArgoCD, name: str, within: float) -> Json:
    last: list[str | None] = [None]

    def check() -> Json | None:
        app = argo.application(name)
        last[0] = synced_and_healthy(app)
        return app if last[0] is None else None

    return harness.eventually(check, f"Application {name} Synced and Healthy", within,
                              explain=lambda: f"{last[0]}\n{argo.tail()}")


@pytest.mark.timeout(600)
def test_argo_cd_keeps_modelpool_synced_and_healthy_through_swaps_and_git_alone_owns_the_spec(
    kubectl: Kubectl, argo: argocd.ArgoCD
) -> None:
    argo.apply_applications()
    synced = {name: wait_synced_and_healthy(argo, name, 300.0) for name in argocd.APPLICATIONS}
    for app in synced.values():
        assert app["status"]["sync"]["revision"] == argo.revision, app["status"]["sync"]
    harness.wait_pool_ready(kubectl, NAMESPACE, POOL, resident="gemma", within=90.0)
    first_sync = {name: app["status"]["operationState"]["startedAt"]
                  for name, app in synced.items()}

    for model in SWAPS:
        _swap_through_router(kubectl, NAMESPACE, model)
        for name in argocd.APPLICATIONS:
            refreshed = argo.refresh(name)
            # Argo CD's diff: every resource Synced (a Progressing health while the pool's
            # status catches up is allowed for a moment; OutOfSync never is).
            assert refreshed["status"]["sync"]["status"] == "Synced", refreshed["status"]
            app = wait_synced_and_healthy(argo, name, 30.0)
            # Nothing to sync: the automated policy started no operation since the first.
            assert app["status"]["operationState"]["startedAt"] == first_sync[name], (
                name, app["status"]["operationState"])

    # Who owns what: Argo CD alone owns spec; the reconciler writes status only.
    documents = (harness.rendered_install(kubectl)
                 + harness.rendered_install(kubectl, harness.EXAMPLES))
    own = [d for d in documents if d["kind"] in OWN_KINDS]
    assert {d["kind"] for d in own} == set(OWN_KINDS)
    for doc in own:
        live = _live(kubectl, doc)
        owners = spec_owners(live)
        assert owners == [f"{GIT_MANAGER} (Apply, main resource)"], (key_of(doc), owners)
        reconciler_writes = [
            e for e in live["metadata"]["managedFields"] if e["manager"] == RECONCILER_MANAGER
        ]
        assert reconciler_writes, f"the reconciler never wrote {key_of(doc)}"
        assert all(e.get("subresource") == "status" for e in reconciler_writes), (
            key_of(doc), reconciler_writes)
    pool = next(d for d in own if d["kind"] == "ModelPool")
    assert RECONCILER_MANAGER in status_writers(_live(kubectl, pool))


@pytest.mark.unit
def test_spec_owners_and_what_reads_synced_and_healthy() -> None:
    obj = {
        "kind": "ModelPool",
        "metadata": {"name": "p", "resourceVersion": "9", "managedFields": [
            {"manager": GIT_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {}}},
            {"manager": RECONCILER_MANAGER, "operation": "Update", "subresource": "status",
             "fieldsV1": {"f:status": {}}},
        ]},
        "spec": {"members": []},
        "status": {"phase": "Ready"},
    }
    assert spec_owners(obj) == [f"{GIT_MANAGER} (Apply, main resource)"]
    assert status_writers(obj) == {RECONCILER_MANAGER}
    healthy = {"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"},
                          "resources": [{"kind": "ModelPool", "name": "p", "status": "Synced"}]}}
    assert synced_and_healthy(healthy) is None
    drifted = json.loads(json.dumps(healthy))
    drifted["status"]["resources"][0]["status"] = "OutOfSync"
    assert "OutOfSync" in (synced_and_healthy(drifted) or "")
    progressing = json.loads(json.dumps(healthy))
    progressing["status"]["health"]["status"] = "Progressing"
    assert "Progressing" in (synced_and_healthy(progressing) or "")
