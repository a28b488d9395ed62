"""What the templates render: golden files of each template's output, and the properties
that matter whatever the golden files say (restricted pods, the router's exact rights,
owner references, the config hash, Recreate for GPU servers).

Regenerate the golden files with MODELPOOL_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from reconciler.render import (
    ROUTER_KINDS,
    SERVER_KINDS,
    Renderer,
    RenderError,
    router_watches_servers,
)
from reconciler.spec import (
    KvCache,
    ModelPoolSpec,
    ModelRouterSpec,
    ModelServerSpec,
    SpecError,
)
from tests.unit.test_render_cases import CHAT, EDGE, EMBED, GEMMA, POOL, QWEN, SERVERS, body

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("MODELPOOL_UPDATE_GOLDEN") == "1"
ROOT = Path(__file__).resolve().parents[2]

RENDERER = Renderer()

CASES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "server-llamacpp-member": lambda: RENDERER.model_server(
        GEMMA, replicas=0, owner_uid="uid-gemma", pool="gpu0", routers=["chat"]
    ),
    "server-vllm-member": lambda: RENDERER.model_server(
        QWEN, replicas=1, owner_uid="uid-qwen", pool="gpu0"
    ),
    "server-generic-standalone": lambda: RENDERER.model_server(
        EMBED, replicas=2, owner_uid=None
    ),
    "router-pooled": lambda: RENDERER.router(
        CHAT, servers=SERVERS, pools=[POOL], owner_uid="uid-chat"
    ),
    "router-urls": lambda: RENDERER.router(EDGE, servers={}, pools=[], owner_uid=None),
}


def _dump(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    rendered = CASES[case]()
    path = GOLDEN / f"{case}.yaml"
    if UPDATE:
        path.write_text(_dump(rendered))
    assert path.exists(), f"no golden file {path.name}: run with MODELPOOL_UPDATE_GOLDEN=1"
    expected = list(yaml.safe_load_all(path.read_text()))
    assert _dump(rendered) == _dump(expected), f"{path.name} differs; review and regenerate"


def test_golden_files_have_cases() -> None:
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(CASES)


def _all_rendered() -> list[dict[str, Any]]:
    return [obj for make in CASES.values() for obj in make()]


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = _by_kind(objects, kind)
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def test_server_kinds_and_names() -> None:
    objects = RENDERER.model_server(GEMMA, replicas=1, owner_uid=None)
    # the claim of saved slots only with spec.kvCache.storageClassName
    assert [(o["apiVersion"], o["kind"]) for o in objects] == list(SERVER_KINDS[:-1])
    assert {o["metadata"]["name"] for o in objects} == {"gemma"}
    assert {o["metadata"]["namespace"] for o in objects} == {"demo"}


@pytest.mark.parametrize("replicas", [0, 1, 3])
def test_server_replicas_come_from_the_caller(replicas: int) -> None:
    deploy = _one(RENDERER.model_server(EMBED, replicas=replicas, owner_uid=None), "Deployment")
    assert deploy["spec"]["replicas"] == replicas


def test_negative_replicas_refused() -> None:
    with pytest.raises(RenderError, match="gemma"):
        RENDERER.model_server(GEMMA, replicas=-1, owner_uid=None)


def test_runtime_commands_and_probes() -> None:
    def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
        c: dict[str, Any] = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return c

    llama = container(RENDERER.model_server(GEMMA, replicas=1, owner_uid=None))
    assert llama["command"] == ["/app/llama-server"]
    assert llama["args"] == [
        "--model", "/models/gemma-3-4b-it-Q4_K_M.gguf", "--host", "0.0.0.0", "--port", "8080",
        "--alias", "gemma", "--ctx-size", "8192",
    ]
    assert llama["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}

    vllm = container(RENDERER.model_server(QWEN, replicas=1, owner_uid=None))
    assert "command" not in vllm
    assert vllm["args"] == [
        "--model", "/weights/Qwen2.5-1.5B-Instruct", "--port", "8000",
        "--served-model-name", "qwen", "--max-model-len", "8192",
    ]
    assert vllm["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}

    generic = container(RENDERER.model_server(EMBED, replicas=1, owner_uid=None))
    assert "command" not in generic
    assert generic["args"] == ["serve", "--listen", ":9000"]
    assert generic["readinessProbe"]["tcpSocket"] == {"port": "http"}
    assert generic["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]


def test_readiness_path_overrides_the_runtime_default() -> None:
    spec = body("ModelServer", "g", {"runtime": "generic", "image": "i", "readinessPath": "/ok"})
    objects = RENDERER.model_server(ModelServerSpec.from_body(spec), replicas=1, owner_uid=None)
    probe = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert probe["readinessProbe"]["httpGet"]["path"] == "/ok"


def test_gpu_requests_equal_limits() -> None:
    deploy = _one(RENDERER.model_server(QWEN, replicas=1, owner_uid=None), "Deployment")
    resources = deploy["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "16Gi", "amd.com/gpu": "2"}
    assert resources["limits"] == {"memory": "16Gi", "amd.com/gpu": "2"}
    cpu_only = _one(RENDERER.model_server(EMBED, replicas=1, owner_uid=None), "Deployment")
    assert cpu_only["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "2"}
    }


def test_a_budgeted_members_footprint_is_in_its_environment_unless_it_sets_one() -> None:
    def env(ms: ModelServerSpec, footprint: int | None) -> list[dict[str, Any]]:
        deploy = _one(RENDERER.model_server(ms, replicas=1, owner_uid=None, pool="p",
                                            gpu_footprint=footprint), "Deployment")
        return list(deploy["spec"]["template"]["spec"]["containers"][0].get("env") or [])

    assert {"name": "MODELPOOL_GPU_FOOTPRINT", "value": str(8 << 30)} in env(GEMMA, 8 << 30)
    assert not [e for e in env(GEMMA, None) if e["name"] == "MODELPOOL_GPU_FOOTPRINT"]
    own = replace(GEMMA, env=(*GEMMA.env, *ModelServerSpec.from_body(body(
        "ModelServer", "own", {"runtime": "llamacpp", "image": "i", "model": "/m.gguf",
                               "env": [{"name": "MODELPOOL_GPU_FOOTPRINT", "value": "5"}]})).env))
    assert [e for e in env(own, 8 << 30) if e["name"] == "MODELPOOL_GPU_FOOTPRINT"] == [
        {"name": "MODELPOOL_GPU_FOOTPRINT", "value": "5"}]


def test_gpu_servers_are_recreated_never_surged() -> None:
    for ms in (GEMMA, QWEN, EMBED):
        deploy = _one(RENDERER.model_server(ms, replicas=1, owner_uid=None), "Deployment")
        assert deploy["spec"]["strategy"] == {"type": "Recreate"}


def test_a_llama_cpp_pod_keeps_its_gpu_5s_after_deletion_others_30s() -> None:
    """llama-server never ends by itself with a non-streamed request in flight (the template
    says why), so waiting longer than a few seconds only keeps the GPU from the pool."""
    grace = {ms.runtime: _one(RENDERER.model_server(ms, replicas=1, owner_uid=None),
                              "Deployment")["spec"]["template"]["spec"][
                                  "terminationGracePeriodSeconds"] for ms in (GEMMA, QWEN)}
    assert grace == {"llamacpp": 5, "vllm": 30}


def test_pool_label_is_not_in_the_selector() -> None:
    objects = RENDERER.model_server(GEMMA, replicas=0, owner_uid=None, pool="gpu0")
    deploy, service = _one(objects, "Deployment"), _one(objects, "Service")
    assert deploy["spec"]["selector"]["matchLabels"] == {"modelpool.dev/model-server": "gemma"}
    assert service["spec"]["selector"] == {"modelpool.dev/model-server": "gemma"}
    assert deploy["spec"]["template"]["metadata"]["labels"]["modelpool.dev/pool"] == "gpu0"
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "modelpool"
        assert labels["modelpool.dev/pool"] == "gpu0"
    standalone = RENDERER.model_server(GEMMA, replicas=0, owner_uid=None)
    assert "modelpool.dev/pool" not in _one(standalone, "Deployment")["metadata"]["labels"]


def test_service_port_is_named_http() -> None:
    service = _one(RENDERER.model_server(QWEN, replicas=1, owner_uid=None), "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_a_persisted_kv_cache_is_llama_servers_slot_save_path_on_its_claim() -> None:
    ms = replace(GEMMA, kv_cache=KvCache(persist=True, pvc="gemma-kv"))
    objects = RENDERER.model_server(ms, replicas=1, owner_uid=None)
    deploy = _one(objects, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container, files = pod["containers"]
    # beside llama-server, the product's image removes the files no manifest names
    assert files["name"] == "kv-files" and files["image"] == RENDERER.router_image
    assert files["command"] == ["modelpool-kv-files"]
    assert files["args"] == ["--dir", "/var/lib/modelpool/kv-cache", "--port", "8091"]
    assert files["ports"] == [{"name": "kv-files", "containerPort": 8091, "protocol": "TCP"}]
    assert files["volumeMounts"] == [{"name": "kv-cache",
                                      "mountPath": "/var/lib/modelpool/kv-cache"}]
    assert files["securityContext"]["runAsNonRoot"] is True
    # ...whose port only the reconciler's pods may reach
    rules = _one(objects, "NetworkPolicy")["spec"]["ingress"]
    kv_rule = next(r for r in rules if r["ports"] == [{"port": "kv-files", "protocol": "TCP"}])
    assert [f["podSelector"]["matchLabels"] for f in kv_rule["from"]] == [
        {"app.kubernetes.io/name": "modelpool-reconciler"}]
    on_port = replace(ms, port=8091)  # a server on 8091 moves it to the next port
    moved = _one(RENDERER.model_server(on_port, replicas=1, owner_uid=None), "Deployment")
    assert moved["spec"]["template"]["spec"]["containers"][1]["ports"][0][
        "containerPort"] == 8092
    args = container["args"]
    assert args[args.index("--slot-save-path") + 1] == "/var/lib/modelpool/kv-cache/"
    assert {"name": "kv-cache", "mountPath": "/var/lib/modelpool/kv-cache"} in container[
        "volumeMounts"]
    assert {"name": "kv-cache", "persistentVolumeClaim": {"claimName": "gemma-kv"}} in pod[
        "volumes"]
    # off: nothing of it
    off = replace(GEMMA, kv_cache=KvCache(persist=False, pvc="gemma-kv"))
    text = json.dumps(RENDERER.model_server(off, replicas=1, owner_uid=None))
    assert "slot-save-path" not in text and "kv-cache" not in text and "kv-files" not in text


def test_a_storage_class_gets_a_claim_owned_by_the_server_and_named_for_it() -> None:
    ms = replace(GEMMA, kv_cache=KvCache(persist=True, storage_class="fast",
                                         storage_size=20 << 30))
    objects = RENDERER.model_server(ms, replicas=1, owner_uid="u-1")
    claim = _one(objects, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "gemma-kv-cache"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "20Gi"}}}
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "kv-cache", "persistentVolumeClaim": {"claimName": "gemma-kv-cache"}} in pod[
        "volumes"]
    # its stale files removed before llama-server starts, by the product's image
    (init,) = pod["initContainers"]
    assert init["command"] == ["modelpool-kv-clean"]
    assert init["image"] == RENDERER.router_image
    assert init["args"] == ["--dir", "/var/lib/modelpool/kv-cache", "--member", "gemma",
                            "--uid", ms.uid, "--max-age", "86400"]
    assert init["volumeMounts"] == [{"name": "kv-cache",
                                     "mountPath": "/var/lib/modelpool/kv-cache"}]
    assert init["securityContext"]["runAsNonRoot"] is True
    # a claim of the user's is never rendered
    named = replace(GEMMA, kv_cache=KvCache(persist=True, pvc="gemma-kv"))
    assert _by_kind(RENDERER.model_server(named, replicas=1, owner_uid="u-1"),
                    "PersistentVolumeClaim") == []


def test_storage_mounts() -> None:
    pvc = _one(RENDERER.model_server(QWEN, replicas=1, owner_uid=None), "Deployment")
    pod = pvc["spec"]["template"]["spec"]
    claim = {"claimName": "weights", "readOnly": True}
    assert {"name": "models", "persistentVolumeClaim": claim} in pod["volumes"]
    mount = {"name": "models", "mountPath": "/weights", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"]
    host = _one(RENDERER.model_server(GEMMA, replicas=1, owner_uid=None), "Deployment")
    assert host["spec"]["template"]["spec"]["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "models", "hostPath": {"path": "/var/lib/modelpool/models"}},
        {"name": "home", "emptyDir": {}},
    ]


def test_runtimes_get_a_writable_home_unless_they_set_one() -> None:
    def home(ms: ModelServerSpec) -> tuple[list[Any], list[str]]:
        pod = _one(RENDERER.model_server(ms, replicas=1, owner_uid=None), "Deployment")
        c = pod["spec"]["template"]["spec"]["containers"][0]
        homes = [e.get("value") for e in c.get("env", []) if e["name"] == "HOME"]
        return homes, [v["name"] for v in pod["spec"]["template"]["spec"].get("volumes", [])]

    assert home(GEMMA) == (["/home/modelpool"], ["tmp", "models", "home"])
    assert home(QWEN) == (["/home/modelpool"], ["tmp", "models", "home", "dshm"])
    assert home(EMBED) == ([], ["tmp"])  # generic: the image's own layout, and /tmp
    own = body("ModelServer", "own", {"image": "i", "model": "m",
                                      "env": [{"name": "HOME", "value": "/data"}]})
    assert home(ModelServerSpec.from_body(own)) == (["/data"], ["tmp", "home"])


def test_a_server_without_scratch_gets_no_volume_of_its_own() -> None:
    def volumes(ms: ModelServerSpec) -> tuple[list[Any], list[str], list[str]]:
        pod = _one(RENDERER.model_server(ms, replicas=1, owner_uid=None), "Deployment")
        spec = pod["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        homes = [e.get("value") for e in c.get("env", []) if e["name"] == "HOME"]
        mounts = [m["name"] for m in c.get("volumeMounts", [])]
        assert mounts == [v["name"] for v in spec.get("volumes", [])]
        return homes, mounts, [k for k in ("volumes",) if k in spec]

    assert volumes(replace(GEMMA, scratch=False)) == ([], ["models"], ["volumes"])
    assert volumes(replace(QWEN, scratch=False)) == ([], ["models", "dshm"], ["volumes"])
    bare = body("ModelServer", "bare", {"image": "i", "model": "m", "scratch": False})
    # no volume at all: not even empty lists, which the kubelet would treat the same
    assert volumes(ModelServerSpec.from_body(bare)) == ([], [], [])
    assert ModelServerSpec.from_body(body("ModelServer", "d", {"image": "i", "model": "m"})
                                     ).scratch is True
    with pytest.raises(SpecError, match=r"spec\.scratch must be a boolean"):
        ModelServerSpec.from_body(body("ModelServer", "x", {"image": "i", "model": "m",
                                                            "scratch": "no"}))


# --- owner references -------------------------------------------------------------------


def test_owner_references_when_a_uid_is_given() -> None:
    for obj in RENDERER.model_server(GEMMA, replicas=1, owner_uid="uid-gemma"):
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "modelpool.dev/v1alpha1",
                "kind": "ModelServer",
                "name": "gemma",
                "uid": "uid-gemma",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    for obj in RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid="uid-chat"):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("ModelRouter", "chat", "uid-chat")


def test_no_owner_references_without_a_uid() -> None:
    objects = [
        *RENDERER.model_server(GEMMA, replicas=1, owner_uid=None),
        *RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None),
    ]
    assert all("ownerReferences" not in o["metadata"] for o in objects)


# --- the restricted Pod Security level --------------------------------------------------

_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}


def _assert_restricted(pod: dict[str, Any], where: str) -> None:
    sc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), f"{where}: {key}"
    assert sc.get("runAsUser", 1) != 0, where
    for vol in pod.get("volumes", []):
        kinds = set(vol) - {"name"}
        assert kinds <= _RESTRICTED_VOLUMES, f"{where}: volume {vol['name']} is {kinds}"
    for c in pod["containers"] + pod.get("initContainers", []):
        csc = c.get("securityContext", {})
        at = f"{where}/{c['name']}"
        assert csc.get("allowPrivilegeEscalation") is False, at
        # beyond the level: what a container writes goes to a volume, never its image
        assert csc.get("readOnlyRootFilesystem") is True, at
        assert csc.get("capabilities", {}).get("drop") == ["ALL"], at
        assert set(csc.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}, at
        assert not csc.get("privileged"), at
        assert csc.get("runAsNonRoot", sc.get("runAsNonRoot")) is True, at
        assert csc.get("runAsUser", sc.get("runAsUser", 1)) != 0, at
        seccomp = csc.get("seccompProfile", sc.get("seccompProfile", {}))
        assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), at
        for port in c.get("ports", []):
            assert "hostPort" not in port, at


def test_rendered_pods_pass_the_restricted_level() -> None:
    # GEMMA's hostPath volume is the one thing the restricted level forbids (an operator's
    # choice, documented on spec.storage.hostPath); every other rendered pod passes.
    objects = [
        *RENDERER.model_server(QWEN, replicas=1, owner_uid=None),
        *RENDERER.model_server(EMBED, replicas=1, owner_uid=None),
        *RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None),
        *RENDERER.router(EDGE, servers={}, pools=[], owner_uid=None),
    ]
    deployments = _by_kind(objects, "Deployment")
    assert len(deployments) == 4
    for deploy in deployments:
        _assert_restricted(deploy["spec"]["template"]["spec"], deploy["metadata"]["name"])


def test_the_restricted_check_catches_a_hostpath() -> None:
    deploy = _one(RENDERER.model_server(GEMMA, replicas=1, owner_uid=None), "Deployment")
    with pytest.raises(AssertionError, match="hostPath"):
        _assert_restricted(deploy["spec"]["template"]["spec"], "gemma")


# --- the router ---------------------------------------------------------------------------

ROUTER_RIGHTS = {
    ("", "configmaps", "get"),  # its own only: resourceNames
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("modelpool.dev", "modelservers", "get"),
    ("modelpool.dev", "modelservers", "list"),
    ("modelpool.dev", "modelservers", "watch"),
    ("modelpool.dev", "modelpools", "get"),
    ("modelpool.dev", "modelpools", "list"),
    ("modelpool.dev", "modelpools", "watch"),
    ("modelpool.dev", "modelrouters", "get"),
    ("modelpool.dev", "modelrouters", "list"),
    ("modelpool.dev", "modelrouters", "watch"),
    ("discovery.k8s.io", "endpointslices", "get"),
    ("discovery.k8s.io", "endpointslices", "list"),
    ("discovery.k8s.io", "endpointslices", "watch"),
    ("modelpool.dev", "modelpools/status", "patch"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
}


def _rights(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule; a rule limited to named objects counts as
    its resource (the rule's names are checked apart)."""
    out = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def test_router_role_grants_exactly_the_design_rights() -> None:
    objects = RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    role = _one(objects, "Role")
    assert _rights(role["rules"]) == ROUTER_RIGHTS
    assert not any("*" in r for rule in role["rules"] for r in rule["verbs"] + rule["resources"])
    named = {r["resources"][0]: r["resourceNames"] for r in role["rules"] if "resourceNames" in r}
    assert named == {"configmaps": [_one(objects, "ConfigMap")["metadata"]["name"]]}


def test_reconciler_holds_every_right_it_grants_the_router() -> None:
    # RBAC refuses to let the reconciler create a Role granting more than it holds.
    docs = yaml.safe_load_all((ROOT / "manifests" / "clusterrole.yaml").read_text())
    (cluster_role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
    assert ROUTER_RIGHTS - _rights(cluster_role["rules"]) == set()


def test_router_objects_and_binding() -> None:
    objects = RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    assert sorted((o["apiVersion"], o["kind"]) for o in objects) == sorted(ROUTER_KINDS)
    names = {o["kind"]: o["metadata"]["name"] for o in objects}
    assert names == {
        "ServiceAccount": "chat-router", "Role": "chat-router", "RoleBinding": "chat-router",
        "ConfigMap": "chat-config", "Deployment": "chat-router", "Service": "chat-router",
    }
    binding = _one(objects, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "chat-router"
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-router", "namespace": "demo"}
    ]
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "chat-router"


def test_router_of_urls_may_read_its_own_config_map_and_nothing_else() -> None:
    assert not router_watches_servers(EDGE)
    assert router_watches_servers(CHAT)
    objects = RENDERER.router(EDGE, servers={}, pools=[], owner_uid=None)
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    config_map = _one(objects, "ConfigMap")["metadata"]["name"]
    assert _one(objects, "Role")["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [config_map],
         "verbs": ["get", "list", "watch"]}
    ]
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == _one(objects, "ServiceAccount")["metadata"]["name"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--config-map") + 1] == config_map


def test_router_deployment() -> None:
    objects = RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    deploy = _one(objects, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["selector"]["matchLabels"] == {"modelpool.dev/router": "chat"}
    pod = deploy["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "edge"}
    (c,) = pod["containers"]
    assert c["name"] == "router"
    assert c["image"] == "ghcr.io/modelpool/modelpool:0.1.0"
    assert c["command"] == ["modelpool-router"]
    assert c["args"] == ["--config", "/etc/modelpool/router/config.json",
                         "--config-map", "chat-config",
                         "--shutdown-delay", "5", "--shutdown-grace", "25"]
    assert pod["terminationGracePeriodSeconds"] == 35
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
    ]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert c["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/modelpool/router", "readOnly": True}
    ]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": "chat-config"}}]
    service = _one(objects, "Service")
    assert service["spec"]["selector"] == {"modelpool.dev/router": "chat"}
    assert service["spec"]["ports"][0] == {
        "name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"
    }


def _config_and_hash(pools: list[ModelPoolSpec]) -> tuple[str, str]:
    objects = RENDERER.router(CHAT, servers=SERVERS, pools=pools, owner_uid=None)
    text: str = _one(objects, "ConfigMap")["data"]["config.json"]
    deployment = _one(objects, "Deployment")
    # A config change must not roll the pods (the router reloads in place and keeps its
    # held requests): the hash is on the Deployment, never in its pod template.
    assert "annotations" not in deployment["spec"]["template"]["metadata"]
    return text, deployment["metadata"]["annotations"]["modelpool.dev/config-hash"]


def test_config_hash_is_the_sha256_of_the_config() -> None:
    text, digest = _config_and_hash([POOL])
    assert digest == hashlib.sha256(text.encode()).hexdigest()
    assert json.loads(text)["router"] == {"namespace": "demo", "name": "chat"}


def test_config_hash_follows_the_pools() -> None:
    changed = ModelPoolSpec.from_body(
        body("ModelPool", "gpu0", {"members": [{"name": "gemma"}, {"name": "qwen"}],
                                   "swapBudget": "10m"})
    )
    first, second = _config_and_hash([POOL]), _config_and_hash([changed])
    assert first[1] != second[1]
    again = _config_and_hash([POOL])
    assert again == first  # stable: same input, same text


def test_missing_model_server_names_it() -> None:
    with pytest.raises(RenderError, match="ModelServer qwen"):
        RENDERER.router(CHAT, servers={"gemma": GEMMA, "embed": EMBED}, pools=[POOL],
                        owner_uid=None)


def test_member_of_two_pools_names_them() -> None:
    other = ModelPoolSpec.from_body(body("ModelPool", "gpu1", {"members": [{"name": "qwen"}]}))
    with pytest.raises(RenderError, match="qwen is a member of more than one pool: gpu0, gpu1"):
        RENDERER.router(CHAT, servers=SERVERS, pools=[other, POOL], owner_uid=None)


# --- the environment ------------------------------------------------------------------------


def test_templates_are_found_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert Renderer().templates_dir == ROOT / "templates"
    assert Renderer().model_server(GEMMA, replicas=1, owner_uid=None)


def test_templates_dir_can_be_overridden(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "templates", tmp_path / "t")
    service = tmp_path / "t" / "model-server" / "service.yaml.j2"
    service.write_text(service.read_text().replace("type: ClusterIP", "type: NodePort"))
    objects = Renderer(tmp_path / "t").model_server(GEMMA, replicas=1, owner_uid=None)
    assert _one(objects, "Service")["spec"]["type"] == "NodePort"


def test_templates_are_read_once_at_construction(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "templates", tmp_path / "t")
    renderer = Renderer(tmp_path / "t")
    shutil.rmtree(tmp_path / "t")
    assert renderer.model_server(GEMMA, replicas=1, owner_uid=None)
    assert renderer.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)


def test_undefined_template_variables_fail(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "templates", tmp_path / "t")
    service = tmp_path / "t" / "model-server" / "service.yaml.j2"
    service.write_text(service.read_text() + "  clusterIP: {{ no_such_value }}\n")
    renderer = Renderer(tmp_path / "t")
    with pytest.raises(jinja2.UndefinedError, match="no_such_value"):
        renderer.model_server(GEMMA, replicas=1, owner_uid=None)


def test_values_cannot_break_the_yaml() -> None:
    tricky = body(
        "ModelServer",
        "tricky",
        {
            "runtime": "generic",
            "image": "i",
            "args": ["a: b", "- c", "{d}", "'e'", '"f"', "g\nh", "#i", "yes", "1.0", "null"],
            "env": [{"name": "X", "value": "${Y} *z &w"}],
        },
    )
    objects = RENDERER.model_server(ModelServerSpec.from_body(tricky), replicas=1, owner_uid=None)
    c = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["a: b", "- c", "{d}", "'e'", '"f"', "g\nh", "#i", "yes", "1.0", "null"]
    assert c["env"] == [{"name": "X", "value": "${Y} *z &w"}]


def test_the_shutdown_delay_and_grace_period_reach_the_router_and_the_kubelet() -> None:
    """The router's flags, and the pod's terminationGracePeriodSeconds: both and 5 s more,
    so that the kubelet's SIGKILL never cuts a router that keeps to them."""
    proxy = replace(CHAT.proxy, shutdown_delay_seconds=0.5, shutdown_grace_period_seconds=120)
    objects = RENDERER.router(replace(CHAT, proxy=proxy), servers=SERVERS, pools=[POOL],
                              owner_uid=None)
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-4:] == ["--shutdown-delay", "0.5", "--shutdown-grace", "120"]
    assert pod["terminationGracePeriodSeconds"] == 126


def test_an_api_key_secret_is_mounted_and_passed_to_the_router() -> None:
    router = ModelRouterSpec.from_body(
        body(
            "ModelRouter",
            "chat",
            {
                "backends": [{"name": "external", "url": "http://10.0.0.9:8000"}],
                "proxy": {"apiKeySecret": {"name": "router-keys"}},
            },
        )
    )
    objects = RENDERER.router(router, servers={}, pools=[], owner_uid=None)
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "--config", "/etc/modelpool/router/config.json", "--config-map", "chat-config",
        "--api-keys-file", "/etc/modelpool/router-keys/keys",
        "--shutdown-delay", "5", "--shutdown-grace", "25",
    ]
    assert {"name": "api-keys", "mountPath": "/etc/modelpool/router-keys", "readOnly": True} in (
        container["volumeMounts"]
    )
    assert {"name": "api-keys", "secret": {"secretName": "router-keys"}} in pod["volumes"]
    # The router still gets no right to read Secrets: the kubelet mounts it.
    assert not [r for r in _one(objects, "Role")["rules"] if "secrets" in r["resources"]]


def test_without_an_api_key_secret_the_router_asks_for_no_key() -> None:
    objects = RENDERER.router(CHAT, servers=SERVERS, pools=[POOL], owner_uid=None)
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "--api-keys-file" not in pod["containers"][0]["args"]
    assert all(v["name"] != "api-keys" for v in pod["volumes"])


def _policy(ms: ModelServerSpec, routers: list[str], renderer: Renderer = RENDERER,
            ) -> dict[str, Any] | None:
    objects = renderer.model_server(ms, replicas=0, owner_uid="uid", routers=routers)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return policies[0] if policies else None


def test_a_members_port_admits_only_its_routers_and_the_reconciler() -> None:
    policy = _policy(GEMMA, ["edge", "chat", "chat"], Renderer(reconciler_namespace="ops"))
    assert policy is not None
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"modelpool.dev/model-server": "gemma"}}
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open: weights, DNS
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    routers, reconciler = rule["from"]
    assert routers == {"podSelector": {"matchExpressions": [
        {"key": "modelpool.dev/router", "operator": "In", "values": ["chat", "edge"]}]}}
    assert reconciler == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "modelpool-reconciler"}}}
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "ModelServer"


def test_without_routers_only_the_reconciler_is_admitted() -> None:
    policy = _policy(GEMMA, [])
    assert policy is not None
    (rule,) = policy["spec"]["ingress"]
    assert [list(peer) for peer in rule["from"]] == [["namespaceSelector", "podSelector"]]


def test_allow_direct_access_renders_no_policy() -> None:
    spec: dict[str, Any] = {"runtime": "llamacpp", "image": "x/y:1", "model": "/m.gguf",
                            "allowDirectAccess": True}
    body = {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelServer",
            "metadata": {"name": "open", "namespace": "demo"}, "spec": spec}
    assert _policy(ModelServerSpec.from_body(body), ["chat"]) is None
    spec["allowDirectAccess"] = "yes"
    with pytest.raises(SpecError, match=r"spec\.allowDirectAccess must be a boolean"):
        ModelServerSpec.from_body(body)


def test_the_prewarm_pod_reads_the_targets_model_on_the_incumbents_node() -> None:
    """A short-lived pod, restricted like every pod rendered, with the target's image and
    its model volume read-only, no GPU, no memory limit (the page cache it fills is
    charged to it) and no requests (BestEffort: it must not take CPU from the incumbent's
    drain), owned by the pool and gone by the swap's deadline."""
    spec = body("ModelServer", "gemma", {
        "runtime": "llamacpp", "image": "ghcr.io/ggml-org/llama.cpp:server",
        "model": "/models/gemma.gguf", "resources": {"gpu": 1},
        "storage": {"pvc": "weights", "mountPath": "/models"}})
    ms = ModelServerSpec.from_body(spec)
    pod = RENDERER.prewarm_pod(ms, pool="gpu0", pool_uid="uid-pool", node="gpu-node",
                               deadline=299.5)
    assert pod is not None
    assert pod["metadata"]["name"] == "gpu0-prewarm"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ModelPool"
    assert "modelpool.dev/model-server" not in pod["metadata"]["labels"]  # no member pod
    assert pod["metadata"]["labels"]["modelpool.dev/prewarm-for"] == "gpu0"
    spec_ = pod["spec"]
    assert (spec_["nodeName"], spec_["restartPolicy"], spec_["activeDeadlineSeconds"]) == (
        "gpu-node", "Never", 300)
    (container,) = spec_["containers"]
    assert container["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert container["command"][-1] == "/models/gemma.gguf"
    assert "resources" not in container
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec_["securityContext"]["runAsNonRoot"] is True
    assert container["volumeMounts"] == [
        {"name": "models", "mountPath": "/models", "readOnly": True}]
    assert spec_["volumes"] == [{"name": "models", "persistentVolumeClaim": {
        "claimName": "weights", "readOnly": True}}]
    # a model named outside the volume (a directory of files, say): the whole volume
    elsewhere = ModelServerSpec.from_body(body("ModelServer", "qwen", {
        "runtime": "vllm", "image": "vllm/vllm-openai", "model": "Qwen/Qwen2.5-7B",
        "storage": {"hostPath": "/var/lib/models", "mountPath": "/root/.cache"}}))
    pod = RENDERER.prewarm_pod(elsewhere, pool="p", pool_uid=None, node="n", deadline=1)
    assert pod is not None and pod["spec"]["containers"][0]["command"][-1] == "/root/.cache"
    assert pod["spec"]["volumes"][0]["hostPath"] == {"path": "/var/lib/models"}
    # no volume, nothing to read
    no_volume = ModelServerSpec.from_body(body("ModelServer", "x", {
        "runtime": "llamacpp", "image": "i", "model": "/models/x.gguf"}))
    assert RENDERER.prewarm_pod(no_volume, pool="p", pool_uid=None, node="n", deadline=1) is None
