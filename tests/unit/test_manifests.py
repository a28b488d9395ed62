"""The install manifests: the CRDs carry the defaults, rules, columns and names of
DESIGN.md "API" (and the same defaults as reconciler/spec.py), the reconciler's RBAC is
least privilege, and examples/ is a pool of two real runtimes behind a router. Their
builds with kubectl's kustomize are tests/functional/test_kustomize_builds.py."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.quantity import QuantityError, parse_bytes
from reconciler.spec import (
    ModelPoolSpec,
    ModelRouterSpec,
    ModelServerSpec,
    SpecError,
    parse_duration,
)
from tests.unit.test_render import _assert_restricted

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "manifests" / "crds"
KUBECTL = shutil.which("kubectl")

def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)}"
    return found[0]


BASE_OBJECTS = {
    ("CustomResourceDefinition", "modelservers.modelpool.dev"),
    ("CustomResourceDefinition", "modelpools.modelpool.dev"),
    ("CustomResourceDefinition", "modelrouters.modelpool.dev"),
    ("Namespace", "modelpool-system"),
    ("ServiceAccount", "modelpool-reconciler"),
    ("ClusterRole", "modelpool-reconciler"),
    ("ClusterRoleBinding", "modelpool-reconciler"),
    ("Role", "modelpool-reconciler-leader-election"),
    ("RoleBinding", "modelpool-reconciler-leader-election"),
    ("Deployment", "modelpool-reconciler"),
    ("Service", "modelpool-reconciler-metrics"),
}


# --- the CRDs -------------------------------------------------------------------------------


def _crd(plural: str) -> dict[str, Any]:
    (crd,) = _load(CRDS / f"modelpool.dev_{plural}.yaml")
    return crd


def _version(plural: str) -> dict[str, Any]:
    (version,) = _crd(plural)["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    return version  # type: ignore[no-any-return]


def _schema(plural: str) -> dict[str, Any]:
    return _version(plural)["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("plural", "kind", "short", "columns"),
    [
        ("modelservers", "ModelServer", "ms", ["Runtime", "Phase", "Pool", "Age"]),
        ("modelpools", "ModelPool", "mpool",
         ["Resident", "Phase", "Policy", "Residents", "Budget", "Room", "Age"]),
        ("modelrouters", "ModelRouter", "mrouter", ["Phase", "Endpoint", "Age"]),
    ],
)
def test_crd_names_columns_and_status(
    plural: str, kind: str, short: str, columns: list[str]
) -> None:
    crd = _crd(plural)
    assert crd["metadata"]["name"] == f"{plural}.modelpool.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (kind, plural, [short])
    assert names["categories"] == ["modelpool-all"]
    assert crd["spec"]["scope"] == "Namespaced"
    version = _version(plural)
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns
    status = _schema(plural)["properties"]["status"]["properties"]
    assert {"conditions", "observedGeneration"} <= set(status)
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def _rules(schema: dict[str, Any], path: str = "") -> list[tuple[str, str, str]]:
    rules = schema.get("x-kubernetes-validations", [])
    found = [(path or ".", r["rule"], r["message"]) for r in rules]
    for key, sub in schema.get("properties", {}).items():
        found += _rules(sub, f"{path}.{key}")
    if "items" in schema:
        found += _rules(schema["items"], f"{path}[]")
    return found


@pytest.mark.unit
@pytest.mark.parametrize("plural", ["modelservers", "modelpools", "modelrouters"])
def test_every_rule_has_a_message_naming_a_field(plural: str) -> None:
    rules = _rules(_schema(plural))
    assert rules
    for path, rule, message in rules:
        assert "spec." in message or "metadata.name" in message or "backend" in message, (
            f"{path}: {rule}: message {message!r} names no field"
        )


@pytest.mark.unit
def test_the_cel_rules_of_the_issue_exist() -> None:
    pool = {(p, r) for p, r, _ in _rules(_schema("modelpools"))}
    router = {(p, r) for p, r, _ in _rules(_schema("modelrouters"))}
    server = {(p, r) for p, r, _ in _rules(_schema("modelservers"))}
    assert any(p == ".spec" and "self.default" in r for p, r in pool)
    assert any(p == ".spec" and "exists_one" in r and "members" in r for p, r in pool)
    for field in ("swapBudget", "minResidency", "maxWait", "reclaimAfter", "idleUnloadAfter"):
        assert any(p == f".spec.{field}" and "duration('0s')" in r for p, r in pool), field
    assert any(p == ".spec.proxy.responseHeaderTimeout" and "duration" in r for p, r in router)
    for field in ("shutdownDelay", "shutdownGracePeriod"):
        assert any(p == f".spec.proxy.{field}" and "duration('1h')" in r
                   for p, r in router), field
    assert any(p == ".spec.port" and "65535" in r for p, r in server)
    assert any(p == ".spec.proxy.port" and "65535" in r for p, r in router)
    assert any(p == ".spec.backends[]" and "modelServerRef" in r and "url" in r for p, r in router)
    assert any(p == ".spec" and "exists_one" in r and "backends" in r for p, r in router)
    assert any(p == ".spec" and "self.defaultRoute" in r for p, r in router)
    assert any(p == ".spec" and "self.members.all" in r and "compareTo" in r and "gpuMemory" in r
               for p, r in pool)
    for where, rules in ((".spec.gpuMemory", pool), (".spec.members[].gpuMemory", pool),
                         (".spec.resources.gpuMemory", server)):
        assert any(p == where and "isGreaterThan(quantity('0'))" in r for p, r in rules), where
        assert any(p == where and r == "isQuantity(string(self))" for p, r in rules), where


@pytest.mark.unit
def test_pool_request_has_a_real_schema() -> None:
    request = _schema("modelpools")["properties"]["status"]["properties"]["request"]
    assert "x-kubernetes-preserve-unknown-fields" not in request
    props = request["properties"]
    assert props["member"] == {**props["member"], "type": "string", "nullable": True}
    assert props["generation"]["type"] == "integer"
    assert {"requestedAt", "requestedBy"} <= set(props)
    status = _schema("modelpools")["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Cold", "Ready", "Swapping", "Degraded"]
    assert set(status["lastSwap"]["properties"]["outcome"]["enum"]) == {
        "Succeeded", "Abandoned", "Failed", "Withdrawn",
    }
    assert {"residentMember", "residentSince", "swap", "lastSwap", "members"} <= set(status)


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    ["300s", "1m30s", "1.5h", "500ms", "10us", "3ns", "0s", "5 m", "5", "-1s", "1.s", "1d", ""],
)
def test_crd_duration_pattern_is_the_spec_grammar(text: str) -> None:
    pool = _schema("modelpools")["properties"]["spec"]["properties"]
    router = _schema("modelrouters")["properties"]["spec"]["properties"]["proxy"]["properties"]
    fields = ("swapBudget", "minResidency", "maxWait", "reclaimAfter", "idleUnloadAfter")
    patterns = {pool[f]["pattern"] for f in fields}
    patterns |= {router[f]["pattern"] for f in
                 ("responseHeaderTimeout", "shutdownDelay", "shutdownGracePeriod")}
    (pattern,) = patterns
    try:
        parse_duration(text)
        parsed = True
    except SpecError:
        parsed = False
    assert bool(re.search(pattern, text)) == parsed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "admitted"),
    [("48Gi", True), ("8G", True), ("1.5Gi", True), ("512Mi", True), ("1e9", True),
     ("4096", True), ("+1Ki", True), (".5Ki", True),
     ("0", False), ("-1Gi", False), ("16GB", False), ("16 Gi", False), ("16gi", False),
     ("lots", False), ("", False), ("1e1.5", False)],
)
def test_crd_gpu_memory_pattern_and_rules_are_the_spec_grammar(text: str, admitted: bool) -> None:
    """The pattern, then the CEL rules (a quantity the library parses, above 0), admit what
    reconciler.quantity parses into bytes, and nothing else."""
    pool = _schema("modelpools")["properties"]["spec"]["properties"]
    member = pool["members"]["items"]["properties"]["gpuMemory"]
    server = _schema("modelservers")["properties"]["spec"]["properties"]["resources"]
    fields = [pool["gpuMemory"], member, server["properties"]["gpuMemory"]]
    (pattern,) = {f["pattern"] for f in fields}
    assert all(f["x-kubernetes-int-or-string"] and f["minimum"] == 0 for f in fields)
    fractional_exponent = re.search(r"[eE][+-]?[0-9]*\.", text) is not None  # isQuantity: no
    zero = bool(re.fullmatch(r"\+?0*\.?0*", text)) and text != ""  # the positive rule: no
    schema = bool(re.search(pattern, text)) and not fractional_exponent and not zero
    try:
        parse_bytes(text, "spec.gpuMemory")
        parsed = True
    except QuantityError:
        parsed = False
    assert schema == parsed == admitted


def _apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: a missing property with a default
    takes it, then defaulting goes on inside objects and list items."""
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        value = [_apply_defaults(schema["items"], v) for v in value]
    return value


_MINIMAL = {
    "modelservers": (ModelServerSpec, {"image": "i", "model": "m"}),
    "modelpools": (ModelPoolSpec, {"members": [{"name": "a"}]}),
    "modelrouters": (ModelRouterSpec, {"backends": [{"name": "a", "url": "http://h"}]}),
}


@pytest.mark.unit
@pytest.mark.parametrize("plural", sorted(_MINIMAL))
def test_crd_defaults_equal_the_spec_defaults(plural: str) -> None:
    cls, spec = _MINIMAL[plural]
    kind = _crd(plural)["spec"]["names"]["kind"]
    body = {"kind": kind, "metadata": {"name": "x", "namespace": "n"}, "spec": spec}
    defaulted = _apply_defaults(_schema(plural), copy.deepcopy(body))
    assert defaulted != body  # the CRD does default something
    assert cls.from_body(defaulted) == cls.from_body(body)  # type: ignore[attr-defined]


@pytest.mark.unit
def test_design_defaults() -> None:
    server = _schema("modelservers")["properties"]["spec"]["properties"]
    assert server["runtime"]["enum"] == ["llamacpp", "vllm", "generic"]
    assert server["runtime"]["default"] == "llamacpp"
    assert server["port"]["default"] == 8080
    assert server["resources"]["properties"]["gpu"]["default"] == 1
    assert server["resources"]["properties"]["gpuResource"]["default"] == "nvidia.com/gpu"
    assert "image" in _schema("modelservers")["properties"]["spec"]["required"]
    pool_spec = _schema("modelpools")["properties"]["spec"]
    assert pool_spec["properties"]["members"]["minItems"] == 1
    assert pool_spec["properties"]["swapPolicy"]["enum"] == ["sticky", "fair", "reclaim"]
    assert pool_spec["properties"]["swapPolicy"]["default"] == "sticky"
    assert pool_spec["properties"]["swapBudget"]["default"] == "300s"
    router = _schema("modelrouters")["properties"]["spec"]["properties"]
    assert router["routeStrategy"]["enum"] == ["BackendNameMatch", "Static"]
    assert router["routeStrategy"]["default"] == "BackendNameMatch"
    proxy = router["proxy"]["properties"]
    assert proxy["replicas"]["default"] == 1
    # No default: an unset image is the reconciler's router image (MODELPOOL_ROUTER_IMAGE).
    assert "default" not in proxy["image"]
    assert proxy["port"]["default"] == 8080
    assert proxy["responseHeaderTimeout"]["default"] == "600s"
    assert proxy["shutdownDelay"]["default"] == "5s"
    assert proxy["shutdownGracePeriod"]["default"] == "25s"
    assert proxy["maxHeldRequests"]["default"] == 1000


# --- the reconciler's install ----------------------------------------------------------------


@pytest.mark.unit
def test_cluster_role_is_least_privilege() -> None:
    (role,) = _load(ROOT / "manifests" / "clusterrole.yaml")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert not any("*" in part for triple in granted for part in triple)
    assert not any(r == "secrets" for _, r, _ in granted)
    # It reads the three kinds but never writes a spec (GitOps owns them).
    for kind in ("modelservers", "modelpools", "modelrouters"):
        assert {v for g, r, v in granted if r == kind} == {"get", "list", "watch"}
        assert ("modelpool.dev", f"{kind}/status", "patch") in granted
    assert ("coordination.k8s.io", "leases", "create") not in granted  # a namespaced Role does
    for resource in ("deployments", "services", "configmaps", "serviceaccounts", "roles",
                     "rolebindings"):
        assert {"create", "patch", "delete"} <= {v for _, r, v in granted if r == resource}
    # pods: watched, and a swap's prewarm pod created and deleted (spec.prewarm)
    assert {v for _, r, v in granted if r == "pods"} == {
        "get", "list", "watch", "create", "patch", "delete"}


@pytest.mark.unit
def test_leader_election_role_is_one_lease() -> None:
    role, binding = _load(ROOT / "manifests" / "leader-election-role.yaml")
    assert role["metadata"]["namespace"] == "modelpool-system"
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named and all(r["resourceNames"] == ["modelpool-reconciler"] for r in named)
    assert all(r["resources"] == ["leases"] for r in role["rules"])
    assert binding["subjects"][0]["name"] == "modelpool-reconciler"


@pytest.mark.unit
def test_reconciler_deployment() -> None:
    (deploy,) = _load(ROOT / "manifests" / "deployment.yaml")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "modelpool-reconciler"
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/modelpool/modelpool:0.1.0"
    assert c["args"] == ["run", "--leader-elect"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # A slow start is not a stuck loop: startup gets its own probe, and liveness waits 5 s
    # for an answer (the default 1 s restarted it on busy CPUs).
    assert c["startupProbe"]["httpGet"] == c["livenessProbe"]["httpGet"]
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 60
    assert c["livenessProbe"]["timeoutSeconds"] >= 5
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    assert {e["name"] for e in c["env"]} == {"POD_NAME", "POD_NAMESPACE", "MODELPOOL_ROUTER_IMAGE"}
    # The routers run the reconciler's own image.
    assert {"name": "MODELPOOL_ROUTER_IMAGE", "value": c["image"]} in c["env"]
    # Burstable, never BestEffort (starved on a busy node, its probes time out), and never
    # throttled: CPU and memory requested, no CPU limit.
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    assert "cpu" not in c["resources"].get("limits", {})
    _assert_restricted(pod, "modelpool-reconciler")


# --- examples ----------------------------------------------------------------------------------


@pytest.mark.unit
def test_examples_are_a_pool_of_two_real_runtimes_behind_a_router() -> None:
    files = sorted(p for p in (ROOT / "examples").glob("*.yaml") if p.name != "kustomization.yaml")
    docs = [d for p in files for d in _load(p)]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        d["metadata"].setdefault("namespace", "demo")
        by_kind.setdefault(d["kind"], []).append(d)
    servers = [ModelServerSpec.from_body(d) for d in by_kind["ModelServer"]]
    assert {(s.runtime, s.image) for s in servers} == {
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:server-cuda"),
        ("vllm", "vllm/vllm-openai:v0.11.0"),
    }
    for s in servers:
        assert not any(e.name.startswith("FAKE_") for e in s.env)
    (pool,) = [ModelPoolSpec.from_body(d) for d in by_kind["ModelPool"]]
    assert set(pool.member_names) == {s.name for s in servers}
    assert pool.default in pool.member_names
    (router,) = [ModelRouterSpec.from_body(d) for d in by_kind["ModelRouter"]]
    assert set(router.model_server_refs) == {s.name for s in servers}
