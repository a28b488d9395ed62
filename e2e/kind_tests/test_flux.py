"""GitOps judged by Flux itself: source-controller and kustomize-controller, built from the
Go module proxy, sync modelpool and the examples from a git server in the kind cluster
(`e2e/flux/up.sh`), and their own health checks (kstatus, `wait: true`) decide Ready.

The proof, in one test because each step stands on the one before:

- Flux installs modelpool (the base, through overlays/kind) and the examples and reports
  both Kustomizations Ready at the pushed commit;
- the pool swaps back and forth through the router; after each swap a forced reconcile
  (`reconcile.fluxcd.io/requestedAt`) finds nothing to change: Flux's own apply reports
  every object `unchanged` (none configured, no conflict), the inventory and every object's
  generation and Flux's field ownership stay as they were, and Ready ends True (Flux marks
  it Unknown while it reconciles; it is never False);
- no one but Flux owns a field of a ModelServer, ModelPool or ModelRouter outside their
  status: Flux does not judge this, but it is why the previous point holds;
- a commit that adds a member rolls out: the member is served through the router;
- a commit that gives the pool a memory budget (any two of its three members fit) rolls
  out: two members are served side by side, the third evicts the one used least recently,
  and a forced reconcile after it finds nothing to change;
- a commit that removes the pool (the pool, its members and its router) prunes them, and
  with them everything the reconciler rendered for them.

Afterwards the examples' Kustomization is deleted (it prunes their namespace) and modelpool's
with `deletionPolicy: Orphan`, so the cluster keeps the install the rest of the tier uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from e2e import harness, testbeds
from e2e.local.fixtures import Kubectl

pytestmark = [pytest.mark.timeout(1200), pytest.mark.build("flux")]

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / "e2e" / "flux" / "up.sh"
FLUX = "flux-system"
BASE, EXAMPLES = "modelpool", "modelpool-examples"
KUSTOMIZATIONS = (BASE, EXAMPLES)
DEMO, POOL, ROUTER = "modelpool-demo", "gpu0", "chat"
FLUX_MANAGER = "kustomize-controller"
OWN_KINDS = ("ModelServer", "ModelPool", "ModelRouter")
# What the reconciler renders, found by its label: these must go with the pool.
RENDERED_KINDS = ("deployments,services,configmaps,networkpolicies,serviceaccounts,roles,"
                  "rolebindings")
HELLO: Any = [{"role": "user", "content": "hello"}]

Json = dict[str, Any]


# Flux's objects


def kustomization(kubectl: Kubectl, name: str) -> Json:
    return dict(kubectl.json("get", "kustomization", name, "-n", FLUX))


def inventory(kubectl: Kubectl, name: str) -> list[str]:
    entries = ((kustomization(kubectl, name).get("status") or {}).get("inventory") or {})
    return sorted(str(e["id"]) for e in entries.get("entries") or [])


def ready(obj: Json) -> str | None:
    cond = harness.condition(obj, "Ready")
    return None if cond is None else str(cond.get("status"))


def inventory_objects(kubectl: Kubectl, name: str) -> list[Json]:
    """Every object in a Kustomization's inventory, as the server has it now."""
    objects = []
    for entry in inventory(kubectl, name):
        namespace, obj_name, group, kind = entry.split("_")
        resource = f"{kind.lower()}.{group}" if group else kind.lower()
        args = ["get", resource, obj_name, "--show-managed-fields"]
        args += ["-n", namespace] if namespace else []
        objects.append(dict(kubectl.json(*args)))
    return objects


def fingerprint(objects: list[Json]) -> dict[str, Any]:
    """What a sync that changes nothing leaves as it was: each object's generation and the
    fields Flux owns, with the time it last wrote them."""
    prints = {}
    for obj in objects:
        meta = obj["metadata"]
        flux_fields = [
            (e.get("operation"), e.get("time"), json.dumps(e.get("fieldsV1"), sort_keys=True))
            for e in meta.get("managedFields") or [] if e.get("manager") == FLUX_MANAGER
        ]
        key = f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"
        prints[key] = {"generation": meta.get("generation"), "flux": flux_fields}
    return prints


class ReadyWatch:
    """Every Ready status a Kustomization shows while this is open (a kubectl watch)."""

    def __init__(self, kubectl: Kubectl, name: str) -> None:
        self._argv = [kubectl.binary, f"--kubeconfig={kubectl.kubeconfig}", "get",
                      "kustomization", name, "-n", FLUX, "--watch", "-o", "json"]
        self.seen: list[str | None] = []
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ReadyWatch:
        self._process = subprocess.Popen(self._argv, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        buffer = ""
        for line in self._process.stdout:
            objects, buffer = harness.split_json_stream(buffer + line)
            self.seen.extend(ready(obj) for obj in objects)

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None and self._thread is not None
        self._process.terminate()
        self._process.wait(10)
        self._thread.join(10)
        if self._process.stdout is not None:
            self._process.stdout.close()


def applied_outputs(kubectl: Kubectl, name: str, since: float) -> list[dict[str, str]]:
    """What kustomize-controller's server-side apply reported for `name` since `since`: one
    map of object to action (`created`, `configured`, `unchanged`, ...) per apply."""
    logs = kubectl("logs", "-n", FLUX, "deployment/kustomize-controller",
                   f"--since-time={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since))}",
                   timeout=60.0).stdout
    outputs = []
    for line in logs.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == "server-side apply completed" and record.get("name") == name:
            outputs.append(dict(record.get("output") or {}))
    return outputs


def reconcile(kubectl: Kubectl, kind: str, name: str, within: float = 300.0) -> str:
    """Ask Flux to reconcile now and wait until it handled that request; the token."""
    token = f"{time.time():.6f}"
    kubectl("annotate", "--overwrite", kind, name, "-n", FLUX,
            f"reconcile.fluxcd.io/requestedAt={token}")
    kubectl("wait", kind, name, "-n", FLUX, f"--timeout={int(within)}s",
            f"--for=jsonpath={{.status.lastHandledReconcileAt}}={token}", timeout=within + 30)
    return token


# The git repository Flux syncs


@dataclass
class Repository:
    """A clone of the git server's repository that the test commits to and pushes."""

    url: str
    path: Path
    commits: list[str] = field(default_factory=list)

    @classmethod
    def clone(cls, url: str, path: Path) -> Repository:
        done = subprocess.run(["git", "clone", "-q", url, str(path)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, f"git clone {url}: {done.stderr}"
        return cls(url, path)

    def git(self, *args: str) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@modelpool.invalid",
               "GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@modelpool.invalid"}
        done = subprocess.run(["git", "-C", str(self.path), *args], env=env, check=False,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
        return done.stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        self.git("push", "-q", "origin", "HEAD:main")
        sha = self.git("rev-parse", "HEAD")
        self.commits.append(sha)
        return f"main@sha1:{sha}"


def git_server_url(kubectl: Kubectl) -> str:
    (pod,) = harness.list_pods(kubectl, FLUX, "app=git-server")
    assert pod.ip, pod
    return f"http://{pod.ip}:8080/modelpool.git"


def sync(kubectl: Kubectl, revision: str) -> None:
    """Flux fetches `revision` and applies it with each Kustomization, in the order of their
    dependencies (the examples wait for modelpool to have applied the same revision): Ready."""
    reconcile(kubectl, "gitrepository", "modelpool")
    kubectl("wait", "gitrepository", "modelpool", "-n", FLUX, "--timeout=120s",
            f"--for=jsonpath={{.status.artifact.revision}}={revision}", timeout=150)
    for name in KUSTOMIZATIONS:
        reconcile(kubectl, "kustomization", name)
        obj = kustomization(kubectl, name)
        status = obj.get("status") or {}
        assert status.get("lastAppliedRevision") == revision, json.dumps(status)
        assert ready(obj) == "True", json.dumps(status.get("conditions"))


EXTRA_MEMBER = {
    "apiVersion": harness.API_VERSION,
    "kind": "ModelServer",
    # the overlay sets no namespace: only examples/ does, for what it holds
    "metadata": {"name": "mistral", "namespace": DEMO},
    "spec": {
        "runtime": "llamacpp",
        "image": harness.FAKE_MODEL_IMAGE,
        "model": "/models/mistral.gguf",
        "args": ["--mode", "llamacpp", "--alias", "mistral"],
        "resources": {"gpu": 1, "memory": "1Gi"},
    },
}


def add_member(overlay: Path) -> None:
    """The commit that adds `mistral` to the example pool and its router."""
    (overlay / "mistral.yaml").write_text(yaml.safe_dump(EXTRA_MEMBER))
    spec = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    spec["resources"].append("mistral.yaml")
    spec["patches"] += [
        {"target": {"kind": "ModelPool", "name": POOL}, "patch": yaml.safe_dump(
            [{"op": "add", "path": "/spec/members/-", "value": {"name": "mistral"}}])},
        {"target": {"kind": "ModelRouter", "name": ROUTER}, "patch": yaml.safe_dump(
            [{"op": "add", "path": "/spec/backends/-",
              "value": {"name": "mistral", "modelServerRef": {"name": "mistral"}}}])},
    ]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def add_budget(overlay: Path) -> None:
    """The commit that gives the pool 16 GiB and each of its three members 8 GiB."""
    spec = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    ops: list[Json] = [{"op": "add", "path": "/spec/gpuMemory", "value": "16Gi"}]
    ops += [{"op": "add", "path": f"/spec/members/{i}/gpuMemory", "value": "8Gi"}
            for i in range(3)]
    spec["patches"].append({"target": {"kind": "ModelPool", "name": POOL},
                            "patch": yaml.safe_dump(ops)})
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def residents(kubectl: Kubectl) -> set[str] | None:
    status = harness.pool_status(kubectl, DEMO, POOL)
    if status.get("phase") != "Ready":
        return None
    return {r["name"] for r in status.get("residents") or []}


def remove_pool(overlay: Path) -> None:
    """The commit that removes the pool, its members and its router: the namespace stays."""
    spec = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    namespace_patches = [p for p in spec["patches"] if p["target"]["kind"] == "Namespace"]
    new = {"apiVersion": spec["apiVersion"], "kind": spec["kind"],
           "resources": ["../../examples/namespace.yaml"], "patches": namespace_patches}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(new, sort_keys=False))
    (overlay / "mistral.yaml").unlink()


def rendered(kubectl: Kubectl) -> list[str]:
    """Every object in the examples' namespace that the reconciler rendered, and its pods."""
    listed = kubectl.json("get", f"{RENDERED_KINDS},pods", "-n", DEMO, "-l",
                          "app.kubernetes.io/part-of=modelpool")["items"]
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in listed)


def spec_owners(obj: Json) -> list[str]:
    """The managers that own a field of `obj` outside its status."""
    owners = []
    for entry in obj["metadata"].get("managedFields") or []:
        if entry.get("subresource") == "status":
            continue
        fields = set((entry.get("fieldsV1") or {}).keys()) - {"f:status"}
        if fields:
            owners.append(f"{entry.get('manager')} ({entry.get('operation')})")
    return owners


# The test


@pytest.fixture(scope="module")
def flux(kind_kubeconfig: Path, kind_kubectl: Kubectl) -> Iterator[Kubectl]:
    kubectl = kind_kubectl
    # Flux's images are side-loaded into this process's cluster (a second worker's is not
    # `modelpool`: e2e/testbeds.py).
    env = {**os.environ, "KUBECONFIG": str(kind_kubeconfig),
           "KIND_CLUSTER_NAME": testbeds.kind_cluster()}
    done = subprocess.run(["bash", str(UP)], env=env, capture_output=True, text=True,
                          timeout=1500, check=False)
    assert done.returncode == 0, f"e2e/flux/up.sh exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip().splitlines()[-1].split() == list(KUSTOMIZATIONS), done.stdout
    try:
        yield kubectl
    finally:
        kubectl("patch", "kustomization", BASE, "-n", FLUX, "--type=merge",
                "-p", json.dumps({"spec": {"deletionPolicy": "Orphan"}}), check=False)
        kubectl("delete", "kustomization", EXAMPLES, "-n", FLUX, "--timeout=180s",
                check=False, timeout=200)
        kubectl("delete", "kustomization", BASE, "-n", FLUX, "--timeout=60s",
                check=False, timeout=90)
        kubectl("delete", "gitrepository", "modelpool", "-n", FLUX, check=False)
        kubectl("delete", "namespace", DEMO, "--ignore-not-found", "--timeout=180s",
                check=False, timeout=200)


async def test_flux_syncs_modelpool_and_finds_nothing_to_change_through_swaps(
    flux: Kubectl,
) -> None:
    kubectl = flux
    # Installed and Ready, as Flux judges.
    for name in KUSTOMIZATIONS:
        obj = kustomization(kubectl, name)
        assert ready(obj) == "True", json.dumps(obj.get("status"))
    assert inventory(kubectl, EXAMPLES) == sorted([
        f"_{DEMO}__Namespace",
        f"{DEMO}_{POOL}_modelpool.dev_ModelPool",
        f"{DEMO}_{ROUTER}_modelpool.dev_ModelRouter",
        f"{DEMO}_gemma_modelpool.dev_ModelServer",
        f"{DEMO}_qwen_modelpool.dev_ModelServer",
    ])
    assert "modelpool-system_modelpool-reconciler_apps_Deployment" in inventory(kubectl, BASE)

    (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, DEMO, ROUTER, None,
                                        180.0)
    client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                max_retries=0, timeout=300)
    try:
        for member in ("qwen", "gemma", "qwen"):
            reply = await client.chat.completions.create(model=member, messages=HELLO,
                                                         max_tokens=4)
            assert reply.model == member and reply.choices[0].message.content, reply
            await asyncio.to_thread(harness.wait_pool_ready, kubectl, DEMO, POOL, member, 60.0)
            for name in KUSTOMIZATIONS:
                await asyncio.to_thread(assert_nothing_to_change, kubectl, name)
        for obj in inventory_objects(kubectl, EXAMPLES):
            if obj["kind"] in OWN_KINDS:
                assert spec_owners(obj) == [f"{FLUX_MANAGER} (Apply)"], (
                    obj["kind"], obj["metadata"]["name"], spec_owners(obj))

        # A commit that adds a member rolls out.
        with tempfile.TemporaryDirectory() as scratch:
            repo = await asyncio.to_thread(Repository.clone, git_server_url(kubectl),
                                           Path(scratch) / "modelpool")
            overlay = repo.path / "overlays" / "examples-testbed"
            add_member(overlay)
            revision = await asyncio.to_thread(repo.commit, "examples: mistral joins the pool")
            await asyncio.to_thread(sync, kubectl, revision)
            assert f"{DEMO}_mistral_modelpool.dev_ModelServer" in inventory(kubectl, EXAMPLES)
            # the router serves the new member once its configuration reached the pod
            deadline = time.monotonic() + 120.0
            while "mistral" not in {m.id for m in (await client.models.list()).data}:
                assert time.monotonic() < deadline, "the router never listed mistral"
                await asyncio.sleep(0.5)
            reply = await client.chat.completions.create(model="mistral", messages=HELLO,
                                                         max_tokens=4)
            assert reply.model == "mistral" and reply.choices[0].message.content, reply
            await asyncio.to_thread(harness.wait_pool_ready, kubectl, DEMO, POOL, "mistral",
                                    60.0)

            # A commit that gives the pool a memory budget: two members side by side.
            add_budget(overlay)
            revision = await asyncio.to_thread(repo.commit, "examples: the pool gets 16 GiB")
            await asyncio.to_thread(sync, kubectl, revision)
            for member in ("gemma", "qwen", "mistral"):
                reply = await client.chat.completions.create(model=member, messages=HELLO,
                                                             max_tokens=4)
                assert reply.model == member and reply.choices[0].message.content, reply
            await asyncio.to_thread(
                harness.eventually,
                lambda: residents(kubectl) == {"qwen", "mistral"} or None,
                "qwen and mistral resident, gemma evicted", 120.0)
            last = harness.pool_status(kubectl, DEMO, POOL)["lastSwap"]
            assert last["to"] == "mistral" and last["evicted"] == ["gemma"], last
            for name in KUSTOMIZATIONS:
                await asyncio.to_thread(assert_nothing_to_change, kubectl, name)

            # A commit that removes the pool prunes it and all that was rendered for it.
            before = rendered(kubectl)
            assert {"Deployment/mistral", "Deployment/chat-router", "ConfigMap/chat-config",
                    "NetworkPolicy/gemma", "Role/chat-router"} <= set(before), before
            remove_pool(overlay)
            revision = await asyncio.to_thread(repo.commit, "examples: the pool goes")
            await asyncio.to_thread(sync, kubectl, revision)
            assert inventory(kubectl, EXAMPLES) == [f"_{DEMO}__Namespace"]
            for kind in ("modelpools", "modelservers", "modelrouters"):
                left = kubectl.json("get", f"{kind}.{harness.GROUP}", "-n", DEMO)["items"]
                assert left == [], (kind, left)
            await asyncio.to_thread(
                harness.eventually, lambda: rendered(kubectl) == [] or None,
                "everything rendered for the pool garbage-collected", 120.0)
    finally:
        await client.close()


def assert_nothing_to_change(kubectl: Kubectl, name: str) -> None:
    """A forced reconcile of `name` applies nothing: Flux says every object is unchanged,
    and the inventory, generations and Flux's field ownership stay as they were."""
    objects_before = inventory_objects(kubectl, name)
    before = (inventory(kubectl, name), fingerprint(objects_before))
    since = time.time() - 1.0
    with ReadyWatch(kubectl, name) as watch:
        reconcile(kubectl, "kustomization", name)
    obj = kustomization(kubectl, name)
    assert ready(obj) == "True", json.dumps((obj.get("status") or {}).get("conditions"))
    assert "False" not in watch.seen, watch.seen
    outputs = applied_outputs(kubectl, name, since)
    assert outputs, f"kustomize-controller logged no apply of {name} since the request"
    changed = {k: v for out in outputs for k, v in out.items() if v != "unchanged"}
    assert not changed, f"a forced reconcile of {name} changed {changed}"
    after = (inventory(kubectl, name), fingerprint(inventory_objects(kubectl, name)))
    assert after == before
