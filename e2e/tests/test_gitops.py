"""GitOps proof: modelpool installed the way Argo CD syncs it stays in sync while it swaps.

Argo CD (with `ServerSideApply=true`) and Flux apply what `kustomize build` renders by
server-side apply under their own field manager. The design promises that no controller
and no router ever writes a field git owns, so a later sync finds nothing to change and
no conflict, and that every object reports kstatus readiness the way both tools read it.

The test installs the base with the local overlay and `examples/` (retargeted to a fresh
namespace, as Flux's `targetNamespace` or an Argo CD destination would) with the field
manager `argocd-controller` (and again as Flux, `kustomize-controller`), swaps the pool
back and forth through the router, then:

- re-applies the same documents with `--dry-run=server`: no conflict, and every object the
  server would store equals the live one (so a sync would be a no-op);
- reads `managedFields`: no manager but git's owns a `spec` field of a ModelServer,
  ModelPool or ModelRouter, and the reconciler writes only through `status`;
- computes kstatus (the rules of sigs.k8s.io/cli-utils kstatus that these kinds need, plus
  Flux's `Ready` check for our own kinds) for every git object and every Deployment the
  reconciler rendered: all Current.

It installs the cluster-wide reconciler of the base (as a user's sync would), which would
act on every namespace of a shared cluster, next to the in-process reconcilers of other
tests; so it runs on a cluster of its own (this module's `cluster` fixture overrides the
shared one) and, should it ever share one, removes that Deployment again if it was not
there before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import openai
import pytest
import yaml

from e2e import harness
from e2e.local import fixtures as local_fixtures
from e2e.local.fixtures import Kubectl

GIT_MANAGER = "argocd-controller"
# The field managers of Argo CD (ServerSideApply=true) and Flux's kustomize-controller.
GIT_MANAGERS = (GIT_MANAGER, "kustomize-controller")
RECONCILER_MANAGER = "modelpool-reconciler"
OWN_KINDS = ("ModelServer", "ModelPool", "ModelRouter")
POOL = "gpu0"
ROUTER = "chat"
# The example pool's members, in the order the test swaps to them (gemma is the default).
SWAPS = ("qwen", "gemma", "qwen")
SWAP_SECONDS = 60.0

Json = dict[str, Any]

CURRENT = "Current"
IN_PROGRESS = "InProgress"
FAILED = "Failed"
TERMINATING = "Terminating"


# kstatus (pure)


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {
        str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []
    }


def _deployment_status(obj: Mapping[str, Any]) -> tuple[str, str]:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    wanted = int(spec.get("replicas", 1))
    if "observedGeneration" not in status:
        return IN_PROGRESS, "no observedGeneration yet"
    conditions = _conditions(obj)
    progressing = conditions.get("Progressing") or {}
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return FAILED, "progress deadline exceeded"
    counts = {
        name: int(status.get(name) or 0)
        for name in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
    }
    if counts["replicas"] > wanted:
        return IN_PROGRESS, f"{counts['replicas'] - wanted} old replicas pending termination"
    for name in ("updatedReplicas", "readyReplicas", "availableReplicas"):
        if counts[name] < wanted:
            return IN_PROGRESS, f"{name} {counts[name]} of {wanted}"
    available = conditions.get("Available")
    if available is not None and available.get("status") != "True":
        return IN_PROGRESS, "Available is not True"
    return CURRENT, f"{wanted} replicas available"


def _crd_status(obj: Mapping[str, Any]) -> tuple[str, str]:
    conditions = _conditions(obj)
    if (conditions.get("NamesAccepted") or {}).get("status") == "False":
        return FAILED, "names not accepted"
    if (conditions.get("Established") or {}).get("status") != "True":
        return IN_PROGRESS, "not Established"
    return CURRENT, "Established"


def kstatus(obj: Mapping[str, Any]) -> tuple[str, str]:
    """The kstatus of `obj` (Current, InProgress, Failed, Terminating) and why.

    The generic rules (deletion, observedGeneration, `Reconciling`, `Stalled`), the
    built-in rules of the kinds an install holds (Deployment, CRD, Namespace; the others are
    Current once they exist), and for modelpool's kinds also Flux's rule that `Ready` is True.
    """
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return TERMINATING, "being deleted"
    status = obj.get("status") or {}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if observed is not None and generation is not None and observed != generation:
        return IN_PROGRESS, f"observedGeneration {observed} != generation {generation}"
    conditions = _conditions(obj)
    if (conditions.get("Reconciling") or {}).get("status") == "True":
        return IN_PROGRESS, f"Reconciling: {conditions['Reconciling'].get('message', '')}"
    if (conditions.get("Stalled") or {}).get("status") == "True":
        return FAILED, f"Stalled: {conditions['Stalled'].get('message', '')}"
    kind = obj.get("kind")
    if kind == "Deployment":
        return _deployment_status(obj)
    if kind == "CustomResourceDefinition":
        return _crd_status(obj)
    if kind == "Namespace":
        phase = status.get("phase")
        return (CURRENT, "Active") if phase == "Active" else (IN_PROGRESS, f"phase {phase}")
    if kind in OWN_KINDS:
        if observed is None:
            return IN_PROGRESS, "no observedGeneration yet"
        ready = conditions.get("Ready") or {}
        if ready.get("status") != "True":
            return IN_PROGRESS, f"Ready is not True: {ready.get('message', 'absent')}"
        return CURRENT, str(ready.get("reason", "Ready"))
    return CURRENT, "exists"


# Documents and comparisons (pure)


def retarget(documents: Sequence[Json], namespace: str) -> list[Json]:
    """The documents moved to `namespace` (what Flux's targetNamespace does)."""
    moved: list[Json] = []
    for doc in documents:
        copy: Json = json.loads(json.dumps(doc))
        if copy["kind"] == "Namespace":
            copy["metadata"]["name"] = namespace
        else:
            copy["metadata"]["namespace"] = namespace
        moved.append(copy)
    return moved


VOLATILE_METADATA = ("managedFields", "resourceVersion")


def stored_form(obj: Mapping[str, Any]) -> Json:
    """What a sync could change: the object without status and bookkeeping metadata."""
    copy: Json = json.loads(json.dumps(obj))
    copy.pop("status", None)
    for key in VOLATILE_METADATA:
        copy.get("metadata", {}).pop(key, None)
    return copy


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


def _apply(kubectl: Kubectl, manager: str, documents: Sequence[Json], *extra: str) -> str:
    result = kubectl(
        "apply", "--server-side", f"--field-manager={manager}", *extra, "-f", "-",
        input=yaml.safe_dump_all(list(documents)), check=False, timeout=90.0,
    )
    assert result.returncode == 0, f"apply {' '.join(extra)} failed: {result.stderr.strip()}"
    assert "conflict" not in result.stderr.lower(), result.stderr
    return result.stdout


def _live(kubectl: Kubectl, obj: Mapping[str, Any]) -> Json:
    kind, namespace, name = key_of(obj)
    group = str(obj["apiVersion"]).split("/")[0] if "/" in obj["apiVersion"] else ""
    resource = f"{kind.lower()}.{group}" if group else kind.lower()
    args = ["get", resource, name, "--show-managed-fields"]
    if namespace:
        args += ["-n", namespace]
    result: Json = kubectl.json(*args)
    return result


def _swap_through_router(kubectl: Kubectl, namespace: str) -> None:
    (pod,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=60.0)
    client = openai.OpenAI(
        base_url=harness.base_url(pod), api_key="unused", max_retries=0, timeout=SWAP_SECONDS
    )
    try:
        for model in SWAPS:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
            assert reply.choices[0].message.content, f"{model} answered nothing"
            # The reply can come before the status says so (the router probes the target).
            pool = harness.wait_pool_ready(kubectl, namespace, POOL, resident=model, within=10)[
                "status"
            ]
            assert pool.get("residentMember") == model, pool
    finally:
        client.close()


# A cluster of the test's own, whatever MODELPOOL_REUSE_CLUSTER says (see above). On kind
# the cluster-wide reconciler of overlays/kind already acts on every namespace, so this
# module, which installs and removes the base's own, stays on the local testbed.
TESTBED = "local"
cluster = local_fixtures.private_cluster("gitops-cluster")


@pytest.fixture
def gitops_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A namespace name for the examples; the test's apply creates it, teardown deletes it
    and the cluster-wide reconciler Deployment if the test was the one to create it."""
    name = f"gitops-{int(time.time() * 1000) % 10**8}"
    reconciler_before = kubectl(
        "get", "deployment", harness.RECONCILER, "-n", harness.SYSTEM_NAMESPACE, check=False
    ).returncode == 0
    try:
        yield name
    finally:
        kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
        if not reconciler_before:
            # Waits for its pods to go: a test after this one must not meet a second actor.
            kubectl("delete", "deployment", harness.RECONCILER, "-n",
                    harness.SYSTEM_NAMESPACE, "--ignore-not-found", "--cascade=foreground",
                    "--timeout=60s", check=False, timeout=70.0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("manager", GIT_MANAGERS)
def test_a_sync_after_swaps_changes_nothing_and_everything_is_ready(
    kubectl: Kubectl, gitops_namespace: str, manager: str
) -> None:
    base = harness.rendered_install(kubectl)
    examples = retarget(harness.rendered_install(kubectl, harness.EXAMPLES), gitops_namespace)

    # Sync as Argo CD does: CRDs and the reconciler first (a sync wave), then the pool.
    _apply(kubectl, manager, base)
    for plural in harness.CRDS:
        kubectl("wait", "--for=condition=Established", f"crd/{plural}.{harness.GROUP}",
                "--timeout=60s", timeout=65.0)
    harness.wait_reconciler_ready(
        kubectl, harness.Installation(harness.RECONCILER, None), within=90.0
    )
    _apply(kubectl, manager, examples)
    harness.wait_pool_ready(kubectl, gitops_namespace, POOL, resident="gemma", within=90.0)

    _swap_through_router(kubectl, gitops_namespace)
    harness.wait_pool_ready(kubectl, gitops_namespace, POOL, resident=SWAPS[-1], within=30.0)

    # A second sync, dry-run: no conflict, and nothing it would store differs from live.
    documents = base + examples
    dry_run = json.loads(_apply(kubectl, manager, documents, "--dry-run=server", "-o", "json"))
    would_store = dry_run["items"] if dry_run.get("kind") == "List" else [dry_run]
    assert len(would_store) == len(documents)
    drift = []
    for stored in would_store:
        live = _live(kubectl, stored)
        if stored_form(stored) != stored_form(live):
            drift.append(key_of(stored))
    assert not drift, f"a sync would change {drift}"

    # Who owns what: git alone owns spec; the reconciler writes status only.
    own = [d for d in documents if d["kind"] in OWN_KINDS]
    assert {d["kind"] for d in own} == set(OWN_KINDS)
    for doc in own:
        live = _live(kubectl, doc)
        owners = spec_owners(live)
        assert owners == [f"{manager} (Apply, main resource)"], (key_of(doc), owners)
        reconciler_writes = [
            e for e in live["metadata"]["managedFields"] if e["manager"] == RECONCILER_MANAGER
        ]
        assert reconciler_writes, f"the reconciler never wrote {key_of(doc)}"
        assert all(e.get("subresource") == "status" for e in reconciler_writes), (
            key_of(doc), reconciler_writes)
    pool = next(d for d in own if d["kind"] == "ModelPool")
    assert RECONCILER_MANAGER in status_writers(_live(kubectl, pool))

    # kstatus: every git object and every Deployment the reconciler rendered is Current.
    rendered = kubectl.json("get", "deployments", "-n", gitops_namespace)["items"]
    assert {d["metadata"]["name"] for d in rendered} >= {"gemma", "qwen", f"{ROUTER}-router"}

    deadline = time.monotonic() + 30.0
    while True:
        objects = [_live(kubectl, d) for d in documents]
        objects += kubectl.json("get", "deployments", "-n", gitops_namespace)["items"]
        late = [f"{key_of(o)}: {kstatus(o)}" for o in objects if kstatus(o)[0] != CURRENT]
        if not late:
            break
        assert time.monotonic() < deadline, f"not Current after 30s: {late}"
        time.sleep(harness.POLL_SECONDS)


# kstatus rules, by table


def _obj(kind: str, generation: int = 2, **status: Any) -> Json:
    return {"kind": kind, "metadata": {"name": "x", "generation": generation},
            "spec": {}, "status": status}


def _cond(type_: str, status: str, **extra: str) -> Json:
    return {"type": type_, "status": status, **extra}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (_obj("ModelPool", observedGeneration=2, conditions=[_cond("Ready", "True")]), CURRENT),
        (_obj("ModelPool", observedGeneration=1, conditions=[_cond("Ready", "True")]),
         IN_PROGRESS),
        (_obj("ModelPool", conditions=[_cond("Ready", "True")]), IN_PROGRESS),
        (_obj("ModelPool", observedGeneration=2,
              conditions=[_cond("Ready", "True"), _cond("Reconciling", "True")]), IN_PROGRESS),
        (_obj("ModelPool", observedGeneration=2,
              conditions=[_cond("Ready", "False"), _cond("Stalled", "True")]), FAILED),
        (_obj("ModelServer", observedGeneration=2, conditions=[_cond("Ready", "False")]),
         IN_PROGRESS),
        ({**_obj("ModelRouter"), "metadata": {"name": "x", "deletionTimestamp": "now"}},
         TERMINATING),
        (_obj("Deployment", observedGeneration=2, replicas=1, updatedReplicas=1,
              readyReplicas=1, availableReplicas=1,
              conditions=[_cond("Available", "True")]), CURRENT),
        (_obj("Deployment", observedGeneration=2, replicas=2, updatedReplicas=1,
              readyReplicas=1, availableReplicas=1), IN_PROGRESS),
        (_obj("Deployment", observedGeneration=2, replicas=1, updatedReplicas=1,
              readyReplicas=0, availableReplicas=0), IN_PROGRESS),
        ({**_obj("Deployment", observedGeneration=2), "spec": {"replicas": 0}}, CURRENT),
        (_obj("Deployment", observedGeneration=2, conditions=[
            _cond("Progressing", "False", reason="ProgressDeadlineExceeded")]), FAILED),
        (_obj("Deployment"), IN_PROGRESS),
        (_obj("CustomResourceDefinition", conditions=[_cond("Established", "True")]), CURRENT),
        (_obj("CustomResourceDefinition", conditions=[_cond("NamesAccepted", "False")]),
         FAILED),
        (_obj("Namespace", phase="Active"), CURRENT),
        (_obj("ServiceAccount"), CURRENT),
    ],
)
def test_kstatus_rules(obj: Json, expected: str) -> None:
    assert kstatus(obj)[0] == expected


@pytest.mark.unit
def test_spec_owners_and_stored_form() -> None:
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
    assert stored_form(obj) == {"kind": "ModelPool", "metadata": {"name": "p"},
                                "spec": {"members": []}}
    moved = retarget([{"kind": "Namespace", "metadata": {"name": "a"}},
                      {"kind": "ModelPool", "metadata": {"name": "p", "namespace": "a"}}], "b")
    assert [m["metadata"] for m in moved] == [{"name": "b"}, {"name": "p", "namespace": "b"}]
