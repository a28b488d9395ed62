"""Drives the whole system on a cluster the way a user does, for the e2e suite, demos and
soak tests: install from the repo's manifests with kubectl, apply pools, read status.

Everything goes through `kubectl` (a callable such as `e2e.local.fixtures.Kubectl`) and
the public surfaces the system offers: the objects' status, the router pod's addresses,
its `/metrics`. Nothing here imports the reconciler or the router.

Install
    `install(kubectl, scope=None)` runs `kubectl apply --server-side -k overlays/local`:
    the CRDs, RBAC and the reconciler Deployment in `modelpool-system`, the reconciler in
    a pod watching every namespace with leader election. `install(kubectl, scope=NS)`
    applies the same objects except that the reconciler Deployment is replaced by a copy
    named `scoped_reconciler_name(NS)` that watches only NS and elects no leader: tests
    sharing one cluster (integration tests run their own reconciler in-process in their
    namespaces) then never see two actors on one pool. Both wait until the CRDs are
    Established and the reconciler pod is Ready; both return an `Installation`.
    `uninstall_scope(kubectl, NS)` deletes that scoped Deployment.
    `rendered_install(kubectl)` is what `kubectl kustomize overlays/local` prints, parsed;
    `scoped_deployment(deployment, NS)` the scoped copy of the reconciler Deployment.
    A cluster-wide reconciler (`install(kubectl)`) and a scoped one on the same namespace
    would both act on its pools: use one or the other on a shared cluster.
    `install_examples(kubectl)` applies `examples/` (`kubectl apply -k examples`, namespace
    modelpool-demo); `apply_examples(kubectl, NS)` puts the example pool, servers and
    router into NS instead (`kubectl apply -n NS -f ...`, as examples/kustomization.yaml
    suggests), after letting NS admit their hostPath volume (Pod Security privileged);
    `apply_examples(kubectl, NS, EXAMPLES_TESTBED)` the variant whose gemma is a real
    llama-server and whose qwen is the fake in vLLM mode (overlays/examples-testbed).
    `remove_workloads(kubectl, NS)` deletes every ModelRouter, ModelPool and ModelServer
    in NS and waits until the model servers' pods are gone (the GPU is free for the next
    test; router pods drain on their own).

Objects (dicts ready for `apply`)
    `fake_member(name, load_time=3.0, ...)` a ModelServer on `modelpool/fake-model`
    (llama.cpp mode, so the reconciler's idle probe reads `/slots`),
    `pool(name, members, default, swap_budget=...)`, `router(name, backends, ...)`.
    `apply(kubectl, namespace, *objects)` server-side applies them as git would.

Waiting and reading
    `eventually(check, what, within)` polls `check()` until it returns non-None.
    `get(kubectl, namespace, kind, name)`, `pool_status(...)`, `condition(obj, type)`,
    `wait_pool_ready(kubectl, ns, pool, resident=None)` (phase Ready, Ready condition
    True, observedGeneration current; returns the pool),
    `wait_router_ready(kubectl, ns, router, replicas=None)` (ModelRouter Ready and that
    many Ready router pods; returns them as `Pod`s).
    `router_pods`, `member_pods(kubectl, ns, member=None)` list `Pod`s (name, ip, phase,
    ready, pid of the first container, restarts); `pod_kubeconfig(node_state_dir, pod)`
    is the kubeconfig the node agent wrote for that pod's ServiceAccount.
    `base_url(pod)` is `http://<podIP>:8080/v1`; `metrics_url(pod)` is
    `http://<podIP>:9090/metrics` (the router's, and the reconciler's pod too);
    `slots_busy(pod_ip)` whether a llama.cpp member's `/slots` shows a slot processing.
    `reconciler_pod(kubectl, installation)` is the reconciler's Ready pod.

Metrics
    `scrape(url)` fetches a /metrics page and parses it with prometheus_client's parser
    into families by name (a counter's family name has no `_total`);
    `sample_sum(families, sample_name, **labels)` adds the samples of that name whose
    labels include `labels` (0.0 when none).

Sampling
    `MemberWatch(kubectl, namespace)` (a context manager) follows member pods with a
    `kubectl get pods --watch`, so no change is missed between samples; `.max_running`
    is the largest number of distinct members whose pods were Running at one moment,
    `.moments` the sets of members seen running after each change, `.overlaps()` those
    with more than one, `.running` the set now and `.events` how many changes it saw.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_OVERLAY = REPO_ROOT / "overlays" / "local"
EXAMPLES = REPO_ROOT / "examples"
EXAMPLES_TESTBED = REPO_ROOT / "overlays" / "examples-testbed"

GROUP = "modelpool.dev"
API_VERSION = f"{GROUP}/v1alpha1"
SYSTEM_NAMESPACE = "modelpool-system"
RECONCILER = "modelpool-reconciler"
FAKE_MODEL_IMAGE = "modelpool/fake-model:e2e"
ROUTER_IMAGE = "modelpool/router:e2e"
LABEL_SERVER = "modelpool.dev/model-server"
LABEL_ROUTER = "modelpool.dev/router"
LABEL_SCOPE = "modelpool.dev/e2e-scope"
CRDS = ("modelservers", "modelpools", "modelrouters")
ROUTER_PORT = 8080
ROUTER_METRICS_PORT = 9090
# `eventually` checks again after 0.2 s, then each pause half as long again as the last, up
# to 1 s: most checks run `kubectl` (some 70 ms of CPU each, and the API server's work), so a
# wait of a minute at 0.2 s cost 300 of them, a quarter of a core per waiting test.
POLL_SECONDS = 0.2
POLL_MAX_SECONDS = 1.0

Json = dict[str, Any]
T = TypeVar("T")


class KubectlLike(Protocol):
    """What the harness needs of a kubectl runner (e2e.local.fixtures.Kubectl is one)."""

    kubeconfig: Path
    binary: str

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]: ...

    def json(self, *args: str) -> Any: ...


# Waiting


def eventually(
    check: Callable[[], T | None],
    what: str,
    within: float = 60.0,
    explain: Callable[[], object] | None = None,
) -> T:
    """Poll `check` until it returns something other than None; fail naming `what` (and
    what `explain()` says about the last state, when given)."""
    deadline = time.monotonic() + within
    pause = POLL_SECONDS
    while True:
        result = check()
        if result is not None:
            return result
        left = deadline - time.monotonic()
        if left < 0:
            detail = f"; last seen: {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {within:g}s waiting for {what}{detail}")
        time.sleep(min(pause, left + 0.01))  # and one last check at the deadline
        pause = min(pause * 1.5, POLL_MAX_SECONDS)


# Install


@dataclass(frozen=True)
class Installation:
    """The installed system: which Deployment runs the reconciler, and for which scope."""

    reconciler_deployment: str
    scope: str | None
    namespace: str = SYSTEM_NAMESPACE


def scoped_reconciler_name(scope: str) -> str:
    return f"{RECONCILER}-{scope}"


def rendered_install(kubectl: KubectlLike, overlay: Path = LOCAL_OVERLAY) -> list[Json]:
    """`kubectl kustomize <overlay>`: the documents a user's install applies, parsed."""
    text = kubectl("kustomize", str(overlay)).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def scoped_deployment(deployment: Json, scope: str) -> Json:
    """The reconciler Deployment, renamed, selecting its own pods, watching one namespace.

    No leader election: two scopes would contend for the one Lease the base names, and a
    scope has one replica anyway."""
    copy: Json = json.loads(json.dumps(deployment))
    copy["metadata"]["name"] = scoped_reconciler_name(scope)
    copy["metadata"].setdefault("labels", {})[LABEL_SCOPE] = scope
    copy["spec"]["selector"]["matchLabels"][LABEL_SCOPE] = scope
    copy["spec"]["template"]["metadata"]["labels"][LABEL_SCOPE] = scope
    container = copy["spec"]["template"]["spec"]["containers"][0]
    container["args"] = ["run", "--namespace", scope, "--probe-interval", "0.5"]
    return copy


def install(
    kubectl: KubectlLike,
    scope: str | None = None,
    overlay: Path = LOCAL_OVERLAY,
    within: float = 90.0,
) -> Installation:
    """Install modelpool from `overlay`; see the module docstring for `scope`."""
    if scope is None:
        kubectl("apply", "--server-side", "--force-conflicts", "-k", str(overlay), timeout=within)
        installation = Installation(RECONCILER, None)
    else:
        documents = []
        for doc in rendered_install(kubectl, overlay):
            if doc.get("kind") == "Deployment" and doc["metadata"]["name"] == RECONCILER:
                doc = scoped_deployment(doc, scope)
            documents.append(doc)
        kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-",
            input=yaml.safe_dump_all(documents), timeout=within,
        )
        installation = Installation(scoped_reconciler_name(scope), scope)
    wait_established(kubectl, [f"{plural}.{GROUP}" for plural in CRDS], within)
    wait_reconciler_ready(kubectl, installation, within)
    return installation


def wait_established(kubectl: KubectlLike, names: Sequence[str], within: float = 60.0) -> None:
    """Until every CRD of `names` is Established. (`kubectl wait --for=condition=Established`
    fails at once, instead of waiting, on a CRD the API server has not given conditions yet:
    ".status.conditions accessor error: <nil> is of the type <nil>".)"""

    def established() -> bool | None:
        got = kubectl.json("get", "crd", *names)
        items = got.get("items", [got])  # one name: the object itself
        done = [crd for crd in items
                if any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in (crd.get("status") or {}).get("conditions") or [])]
        return True if len(done) == len(names) else None

    eventually(established, f"CRDs {', '.join(names)} Established", within)


def install_examples(kubectl: KubectlLike, examples: Path = EXAMPLES) -> None:
    """`kubectl apply -k examples/` (namespace modelpool-demo)."""
    kubectl("apply", "--server-side", "--force-conflicts", "-k", str(examples))


def reconciler_pod(kubectl: KubectlLike, installation: Installation) -> Pod:
    return wait_reconciler_ready(kubectl, installation, within=30.0)


EXAMPLE_FILES = ("model-servers.yaml", "pool.yaml", "router.yaml")


def apply_examples(kubectl: KubectlLike, namespace: str, examples: Path = EXAMPLES) -> None:
    """The example pool (gpu0: gemma and qwen) and router (chat), applied into `namespace`.

    `examples` is examples/ itself (its hostPath volume needs Pod Security privileged, so
    the namespace is relabelled) or an overlay of it such as `EXAMPLES_TESTBED`, rendered
    by `kubectl kustomize` and applied without its Namespace."""
    if examples == EXAMPLES:
        kubectl("label", "namespace", namespace, "--overwrite",
                "pod-security.kubernetes.io/enforce=privileged")
        files = [arg for name in EXAMPLE_FILES for arg in ("-f", str(examples / name))]
        kubectl("apply", "--server-side", "-n", namespace, *files)
        return
    documents = [d for d in rendered_install(kubectl, examples) if d["kind"] != "Namespace"]
    for doc in documents:
        doc["metadata"].pop("namespace", None)
    apply(kubectl, namespace, *documents)


def remove_workloads(kubectl: KubectlLike, namespace: str, within: float = 60.0) -> None:
    """Delete the namespace's pools, servers and routers and wait until the model servers'
    pods are gone (they hold the GPUs). Router pods are not waited for: each goes on
    serving for its shutdown delay after SIGTERM."""
    kinds = ",".join(f"{plural}.{GROUP}" for plural in ("modelrouters", "modelpools",
                                                       "modelservers"))
    kubectl("delete", kinds, "--all", "-n", namespace, "--wait=false", check=False)
    selector = "app.kubernetes.io/part-of=modelpool,app.kubernetes.io/name!=modelpool-router"
    eventually(lambda: True if not list_pods(kubectl, namespace, selector) else None,
               f"the model servers' pods of {namespace} gone", within)


def wait_reconciler_ready(
    kubectl: KubectlLike, installation: Installation, within: float = 90.0
) -> Pod:
    """The reconciler's pod, once Ready (its /readyz answers after the first list)."""
    selector = "app.kubernetes.io/name=modelpool-reconciler"
    if installation.scope is not None:
        selector += f",{LABEL_SCOPE}={installation.scope}"

    def ready() -> Pod | None:
        pods = [p for p in list_pods(kubectl, installation.namespace, selector) if p.ready]
        if installation.scope is None:
            pods = [p for p in pods if LABEL_SCOPE not in p.labels]
        return pods[0] if pods else None

    return eventually(ready, f"the reconciler {installation.reconciler_deployment} Ready",
                      within)


def uninstall_scope(kubectl: KubectlLike, scope: str) -> None:
    kubectl("delete", "deployment", scoped_reconciler_name(scope), "-n", SYSTEM_NAMESPACE,
            "--ignore-not-found", "--wait=false", check=False)


# Objects


def fake_member(
    name: str,
    load_time: float = 3.0,
    tokens_per_second: float = 50.0,
    env: Mapping[str, str] | None = None,
    image: str = FAKE_MODEL_IMAGE,
    gpu: int = 1,
    scratch: bool = True,
) -> Json:
    """A ModelServer served by the fake model server in llama.cpp mode, its model named
    `name` by `--alias` (as llama-server names it); `gpu=0` for one that runs on CPU,
    `scratch=False` for one with no volume (the fake writes nothing but its GPU lock)."""
    variables = {
        "FAKE_MODEL_LOAD_TIME": str(load_time),
        "FAKE_MODEL_TOKENS_PER_SECOND": str(tokens_per_second),
        **(env or {}),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": {
            "runtime": "llamacpp",
            "image": image,
            "model": f"/models/{name}.gguf",
            "args": ["--mode", "llamacpp", "--alias", name],
            "env": [{"name": k, "value": v} for k, v in variables.items()],
            "resources": {"gpu": gpu},
            **({} if scratch else {"scratch": False}),
        },
    }


def pool(
    name: str,
    members: Sequence[str],
    default: str | None = None,
    swap_budget: str = "60s",
    **extra: Any,
) -> Json:
    spec: Json = {"members": [{"name": m} for m in members], "swapBudget": swap_budget, **extra}
    if default is not None:
        spec["default"] = default
    return {"apiVersion": API_VERSION, "kind": "ModelPool", "metadata": {"name": name},
            "spec": spec}


def router(
    name: str,
    backends: Sequence[str],
    default_route: str | None = None,
    replicas: int = 1,
    response_header_timeout: str = "600s",
    max_held_requests: int | None = None,
    image: str = ROUTER_IMAGE,
) -> Json:
    proxy: Json = {
        "replicas": replicas,
        "image": image,
        "responseHeaderTimeout": response_header_timeout,
    }
    if max_held_requests is not None:
        proxy["maxHeldRequests"] = max_held_requests
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelRouter",
        "metadata": {"name": name},
        "spec": {
            "backends": [{"name": b, "modelServerRef": {"name": b}} for b in backends],
            "defaultRoute": default_route or backends[0],
            "proxy": proxy,
        },
    }


def on_node(server: Json, node: str) -> Json:
    """`server` (a ModelServer) pinned to the node whose hostname is `node`."""
    server["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return server


def router_on_node(router_body: Json, node: str) -> Json:
    """`router_body` (a ModelRouter) pinned to `node`, tolerating a control plane's taint."""
    proxy = router_body["spec"]["proxy"]
    proxy["nodeSelector"] = {"kubernetes.io/hostname": node}
    proxy["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane",
                             "operator": "Exists", "effect": "NoSchedule"}]
    return router_body


def node_volume(namespace: str, claim: str, node: str, path: str,
                access: str = "ReadOnlyMany") -> tuple[Json, Json]:
    """A PersistentVolume on `node`'s directory `path`, bound to the claim `claim` in
    `namespace`, and that claim: how a namespace that enforces `restricted` (which admits
    no hostPath) reaches files put on a node."""
    volume_name = f"{namespace}-{claim}"
    pv = {"apiVersion": "v1", "kind": "PersistentVolume",
          "metadata": {"name": volume_name},
          "spec": {"capacity": {"storage": "10Gi"}, "accessModes": [access],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "hostPath": {"path": path, "type": "Directory"},
                   "claimRef": {"namespace": namespace, "name": claim},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "In",
                        "values": [node]}]}]}}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": claim},
           "spec": {"accessModes": [access], "storageClassName": "",
                    "volumeName": volume_name, "resources": {"requests": {"storage": "10Gi"}}}}
    return pv, pvc


def apply(kubectl: KubectlLike, namespace: str, *objects: Json) -> None:
    """Server-side apply, field manager `kubectl`, as `kubectl apply --server-side` from git."""
    text = yaml.safe_dump_all(list(objects))
    kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=text)


# Reading


def get(kubectl: KubectlLike, namespace: str, kind: str, name: str) -> Json:
    result: Json = kubectl.json("get", kind, name, "-n", namespace)
    return result


def pool_status(kubectl: KubectlLike, namespace: str, name: str) -> Json:
    status: Json = get(kubectl, namespace, f"modelpools.{GROUP}", name).get("status") or {}
    return status


def condition(obj: Json, type_: str) -> Json | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def is_ready(obj: Json) -> bool:
    """kstatus: Ready condition True for the current generation."""
    ready = condition(obj, "Ready")
    observed = (obj.get("status") or {}).get("observedGeneration")
    return (
        ready is not None
        and ready.get("status") == "True"
        and observed == obj["metadata"].get("generation")
    )


def wait_pool_ready(
    kubectl: KubectlLike,
    namespace: str,
    name: str,
    resident: str | None = None,
    within: float = 60.0,
) -> Json:
    """The pool once phase Ready and Ready (kstatus), with `resident` when given."""
    last: list[Json] = [{}]

    def check() -> Json | None:
        obj = get(kubectl, namespace, f"modelpools.{GROUP}", name)
        status = last[0] = obj.get("status") or {}
        if status.get("phase") != "Ready" or not is_ready(obj):
            return None
        if resident is not None and status.get("residentMember") != resident:
            return None
        return obj

    return eventually(check, f"pool {namespace}/{name} Ready with {resident or 'any member'}",
                      within, explain=lambda: json.dumps(last[0]))


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    uid: str
    ip: str | None
    phase: str
    ready: bool
    terminating: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    pid: int | None = None
    restarts: int = 0


def pod_from(obj: Json) -> Pod:
    meta = obj["metadata"]
    status = obj.get("status") or {}
    containers = status.get("containerStatuses") or []
    pid = None
    if containers:
        container_id = str(containers[0].get("containerID") or "")
        if container_id.startswith("local://"):
            pid = int(container_id.removeprefix("local://"))
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return Pod(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        ip=status.get("podIP"),
        phase=status.get("phase") or "Pending",
        ready=ready,
        terminating=meta.get("deletionTimestamp") is not None,
        labels=dict(meta.get("labels") or {}),
        pid=pid,
        restarts=sum(int(c.get("restartCount") or 0) for c in containers),
    )


def list_pods(kubectl: KubectlLike, namespace: str, selector: str) -> list[Pod]:
    items = kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return sorted((pod_from(p) for p in items), key=lambda p: p.name)


def router_pods(kubectl: KubectlLike, namespace: str, router_name: str) -> list[Pod]:
    return list_pods(kubectl, namespace, f"{LABEL_ROUTER}={router_name}")


def member_pods(kubectl: KubectlLike, namespace: str, member: str | None = None) -> list[Pod]:
    selector = LABEL_SERVER if member is None else f"{LABEL_SERVER}={member}"
    return list_pods(kubectl, namespace, selector)


def wait_router_ready(
    kubectl: KubectlLike,
    namespace: str,
    name: str,
    replicas: int | None = None,
    within: float = 60.0,
) -> list[Pod]:
    """The router's Ready pods once the ModelRouter is Ready and `replicas` of them (the
    spec's count when None) are Ready and none is terminating."""

    def check() -> list[Pod] | None:
        obj = get(kubectl, namespace, f"modelrouters.{GROUP}", name)
        if not is_ready(obj):
            return None
        wanted = replicas if replicas is not None else int(
            ((obj["spec"].get("proxy") or {}).get("replicas")) or 1
        )
        pods = router_pods(kubectl, namespace, name)
        ready = [p for p in pods if p.ready and not p.terminating and p.ip]
        return ready if len(ready) == wanted and len(pods) == wanted else None

    return eventually(check, f"router {namespace}/{name} Ready", within)


def base_url(pod: Pod, port: int = ROUTER_PORT) -> str:
    """The OpenAI base URL of a router pod."""
    return f"http://{pod.ip}:{port}/v1"


def metrics_url(pod: Pod, port: int = ROUTER_METRICS_PORT) -> str:
    return f"http://{pod.ip}:{port}/metrics"


def slots_busy(pod_ip: str, port: int = 8080) -> bool:
    """Whether a llama.cpp member's `/slots` (read from here) shows a slot processing."""
    with urllib.request.urlopen(f"http://{pod_ip}:{port}/slots", timeout=5) as r:
        return any(s["is_processing"] for s in json.load(r))


def scrape(url: str, timeout: float = 10.0) -> dict[str, Metric]:
    """A /metrics page, parsed by prometheus_client's parser: families by name."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_sum(families: Mapping[str, Metric], sample_name: str, **labels: str) -> float:
    """The sum of the samples named `sample_name` whose labels include `labels`."""
    return sum(
        float(s.value)
        for family in families.values()
        for s in family.samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def pod_directory(node_state_dir: Path, pod: Pod) -> Path:
    """Where the local node agent keeps the pod's files (logs, volumes, kubeconfig)."""
    return node_state_dir / "pods" / f"{pod.namespace}_{pod.name}_{pod.uid}"


def pod_kubeconfig(node_state_dir: Path, pod: Pod) -> Path:
    """The kubeconfig holding the token of the pod's ServiceAccount (local node agent)."""
    return pod_directory(node_state_dir, pod) / "kubeconfig"


# Sampling


def split_json_stream(buffer: str) -> tuple[list[Json], str]:
    """The whole JSON documents at the start of `buffer` (kubectl's `--watch -o json`
    prints them back to back, pretty-printed) and the incomplete rest."""
    decoder = json.JSONDecoder()
    events: list[Json] = []
    while stripped := buffer.lstrip():
        try:
            event, end = decoder.raw_decode(stripped)
        except ValueError:
            return events, stripped
        events.append(event)
        buffer = stripped[end:]
    return events, ""


class MemberWatch:
    """Follows the member pods of a namespace through a watch; every change is a sample.

    A member counts as running while any of its pods is in phase Running (a terminating
    pod still runs until its process exits, and so still holds the GPU)."""

    def __init__(self, kubectl: KubectlLike, namespace: str) -> None:
        self._argv = [
            kubectl.binary, f"--kubeconfig={kubectl.kubeconfig}", "get", "pods",
            "-n", namespace, "-l", LABEL_SERVER, "--watch", "--output-watch-events",
            "-o", "json",
        ]
        self._pods: dict[str, Pod] = {}
        self._lock = threading.Lock()
        self.moments: list[frozenset[str]] = []
        self.events = 0
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemberWatch:
        self._process = subprocess.Popen(
            self._argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
        if self._thread is not None:
            self._thread.join(10)
        if self._process is not None and self._process.stdout is not None:
            self._process.stdout.close()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        buffer = ""
        for line in self._process.stdout:
            events, buffer = split_json_stream(buffer + line)
            for event in events:
                self._record(event)

    def _record(self, event: Json) -> None:
        pod = pod_from(event["object"])
        with self._lock:
            if event.get("type") == "DELETED":
                self._pods.pop(pod.uid, None)
            else:
                self._pods[pod.uid] = pod
            self.events += 1
            self.moments.append(self._running())

    def _running(self) -> frozenset[str]:
        return frozenset(
            p.labels.get(LABEL_SERVER, "?") for p in self._pods.values() if p.phase == "Running"
        )

    @property
    def running(self) -> frozenset[str]:
        with self._lock:
            return self._running()

    @property
    def max_running(self) -> int:
        with self._lock:
            return max((len(m) for m in self.moments), default=0)

    def overlaps(self) -> list[frozenset[str]]:
        """The moments when more than one member ran."""
        with self._lock:
            return [m for m in self.moments if len(m) > 1]



@contextlib.contextmanager
def sampled(read: Callable[[], T], name: str, interval: float = 0.2) -> Iterator[list[T]]:
    """`read()` called over and over on a thread of its own until the block ends, its
    answers collected (a sampler of something the test watches, e.g. a GPU's ledger);
    one that raises fails the test when the block ends."""
    samples: list[T] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.is_set():
                samples.append(read())
                stop.wait(interval)
        except Exception as error:  # the test fails with it below, not in a thread
            failures.append(error)

    thread = threading.Thread(target=sample, name=name, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures, f"{name}: {failures[0]!r}"
