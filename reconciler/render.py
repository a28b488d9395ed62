"""Turns specs into the Kubernetes objects the reconciler applies, from templates/.

Rendering is pure: one Jinja environment (StrictUndefined) is built when the Renderer is
made, and each call only fills templates and parses the YAML they print. Nothing here talks
to the API server, so every manifest can be tested, and printed by `python -m reconciler
render`, without a cluster. Every interpolated value goes through the `json` filter: JSON is
YAML, so names, args and env values can never break the document.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import yaml

from reconciler import vllm_share
from reconciler.device_claim import POD_CLAIM, REQUEST, claim_name
from reconciler.quantity import format_bytes
from reconciler.router_config import (
    CONFIG_KEY,
    RenderError,
    config_hash,
    config_json,
    readiness_path,
    router_config,
)
from reconciler.spec import (
    API_VERSION,
    DEFAULT_ROUTER_IMAGE,
    KV_CACHE_MOUNT_PATH,
    ModelPoolSpec,
    ModelRouterSpec,
    ModelServerSpec,
)

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "LABEL_POOL",
    "LABEL_ROUTER",
    "LABEL_SERVER",
    "MANAGED_BY",
    "PART_OF",
    "POOL_KINDS",
    "ROUTER_KINDS",
    "SERVER_KINDS",
    "SLOT_GATE",
    "RenderError",
    "Renderer",
    "config_map_name",
    "router_object_name",
    "router_selector",
    "router_watches_servers",
    "server_selector",
]

DEFAULT_TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"

PART_OF = "modelpool"
MANAGED_BY = "modelpool-reconciler"
LABEL_SERVER = "modelpool.dev/model-server"
LABEL_POOL = "modelpool.dev/pool"
LABEL_ROUTER = "modelpool.dev/router"
# The scheduling gate of a pool member's pods: the scheduler places none of them until the
# reconciler lifts it, which it does only for the member that holds the pool's slot.
SLOT_GATE = "modelpool.dev/slot"
CONFIG_HASH_ANNOTATION = "modelpool.dev/config-hash"
ROUTER_CONFIG_DIR = "/etc/modelpool/router"
ROUTER_KEYS_DIR = "/etc/modelpool/router-keys"
ROUTER_HTTP_PORT = 8080
ROUTER_METRICS_PORT = 9090
# The router's program in the product's image, whose entrypoint is the reconciler.
ROUTER_COMMAND = ("modelpool-router",)

# (apiVersion, kind) of everything each owner may render: what a pruner looks for.
SERVER_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("v1", "PersistentVolumeClaim"),
)
# What a pool renders and prunes: its ResourceClaim (a claim pool's).
POOL_KINDS: tuple[tuple[str, str], ...] = (("resource.k8s.io/v1", "ResourceClaim"),)
RECONCILER_NAME = "modelpool-reconciler"  # its pods' app.kubernetes.io/name
# A persisted member's container that removes slot files (modelpool-kv-files), its port's
# name and number.
KV_FILES = "kv-files"
KV_FILES_PORT = 8091
DEFAULT_RECONCILER_NAMESPACE = "modelpool-system"
ROUTER_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
)

_COMMON_TEMPLATE = "_common.j2"  # macros the others import
_SERVER_TEMPLATES = (
    "model-server/deployment.yaml.j2",
    "model-server/service.yaml.j2",
    "model-server/networkpolicy.yaml.j2",
    "model-server/kv-cache-claim.yaml.j2",
)
_PREWARM_TEMPLATE = "model-server/prewarm-pod.yaml.j2"
_CLAIM_TEMPLATE = "model-pool/resourceclaim.yaml.j2"
# libyaml's safe loader where PyYAML was built with it: the same documents as the pure
# Python one, parsed about ten times faster (rendering is most of a reconcile's CPU).
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LABEL_PREWARM = "modelpool.dev/prewarm-for"
_ROUTER_TEMPLATES = (
    "router/serviceaccount.yaml.j2",
    "router/role.yaml.j2",
    "router/rolebinding.yaml.j2",
    "router/configmap.yaml.j2",
    "router/deployment.yaml.j2",
    "router/service.yaml.j2",
)


def router_object_name(router: str) -> str:
    """Name of the router's Deployment, Service, ServiceAccount, Role and RoleBinding."""
    return f"{router}-router"


def config_map_name(router: str) -> str:
    return f"{router}-config"


def server_selector(server: str) -> dict[str, str]:
    """Labels selecting a ModelServer's pods (also its Deployment's selector)."""
    return {LABEL_SERVER: server}


def router_selector(router: str) -> dict[str, str]:
    return {LABEL_ROUTER: router}


def router_watches_servers(router: ModelRouterSpec) -> bool:
    """A router that refers to a ModelServer watches EndpointSlices and the pool kinds
    (and, for pooled members, writes pool requests), and its Role grants that; a router of
    plain URLs may only read its own ConfigMap, as every router does."""
    return bool(router.model_server_refs)


def _owner(kind: str, name: str, uid: str | None) -> dict[str, Any] | None:
    if uid is None:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _server_resources(ms: ModelServerSpec, claimed: bool) -> dict[str, Any]:
    """The container's resources; `claimed`: its device is its pool's ResourceClaim, so
    it requests no GPU of a device plugin and names the claim instead."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if ms.resources.cpu is not None:
        requests["cpu"] = ms.resources.cpu
    if ms.resources.memory is not None:
        requests["memory"] = ms.resources.memory
        limits["memory"] = ms.resources.memory
    if ms.resources.gpu > 0 and not claimed:
        # Extended resources need requests equal to limits.
        requests[ms.resources.gpu_resource] = str(ms.resources.gpu)
        limits[ms.resources.gpu_resource] = str(ms.resources.gpu)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if claimed:
        resources["claims"] = [{"name": POD_CLAIM}]
    return resources


def prewarm_pod_name(pool: str) -> str:
    return f"{pool}-prewarm"[:63].rstrip("-")


class Renderer:
    """Renders ModelServers and ModelRouters; build one at start and share it."""

    def __init__(self, templates_dir: Path | None = None,
                 reconciler_namespace: str = DEFAULT_RECONCILER_NAMESPACE,
                 router_image: str = DEFAULT_ROUTER_IMAGE) -> None:
        """`reconciler_namespace` is where the reconciler's own pods run: a member's
        NetworkPolicy admits its idle probe from there. `router_image` is what a router
        runs unless its `spec.proxy.image` names another: the product's image, the one the
        reconciler itself runs from."""
        self.templates_dir = templates_dir or DEFAULT_TEMPLATES_DIR
        self.reconciler_namespace = reconciler_namespace
        self.router_image = router_image
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(self.templates_dir)),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            # Templates are read here, once; rendering never touches the disk again.
            auto_reload=False,
        )
        self._env.filters["json"] = json.dumps
        names = (_COMMON_TEMPLATE, *_SERVER_TEMPLATES, _PREWARM_TEMPLATE, _CLAIM_TEMPLATE,
                 *_ROUTER_TEMPLATES)
        self._templates = {name: self._env.get_template(name) for name in names}

    def _render(self, names: Sequence[str], context: Mapping[str, Any]) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = []
        for name in names:
            text = self._templates[name].render(context)
            try:
                docs = list(yaml.load_all(text, Loader=_SAFE_LOADER))
            except yaml.YAMLError as e:
                raise RenderError(f"template {name} printed invalid YAML: {e}") from e
            for doc in docs:
                if doc is None:
                    continue
                if not isinstance(doc, dict):
                    raise RenderError(f"template {name} printed a non-object document")
                objects.append(doc)
        return objects

    def model_server(
        self,
        ms: ModelServerSpec,
        *,
        replicas: int,
        owner_uid: str | None,
        pool: str | None = None,
        routers: Sequence[str] = (),
        gpu_footprint: int | None = None,
        device_claim: str | None = None,
        device_memory: int | None = None,
    ) -> list[dict[str, Any]]:
        """The Deployment, Service and NetworkPolicy of `ms`, at `replicas` (pool members
        start at 0; the caller decides). `pool` adds the `modelpool.dev/pool` label (not in
        the selector, so membership can change without replacing the Deployment).
        `gpu_footprint`, a budgeted pool's member's footprint in bytes, is given to the
        container as `MODELPOOL_GPU_FOOTPRINT` (unless its env sets it): what it charges to a
        shared device's memory ledger where one keeps it (the testbeds' fake GPUs).
        `device_claim`, the ResourceClaim of a claim pool's member, is referenced by the pod
        (and by the container, which then requests no GPU resource). `device_memory`, the
        whole memory of a budgeted pool's device, gives a vLLM member its share as
        `--gpu-memory-utilization` (footprint over it) unless its args set one.
        `routers` names the ModelRouters that front `ms`: with the reconciler's pods, the
        only ones its NetworkPolicy lets reach the serving port (none with
        `spec.allowDirectAccess`)."""
        if replicas < 0:
            raise RenderError(f"ModelServer {ms.name}: replicas must not be negative")
        labels = {
            "app.kubernetes.io/name": "model-server",
            "app.kubernetes.io/instance": ms.name,
            "app.kubernetes.io/component": ms.runtime,
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            LABEL_SERVER: ms.name,
        }
        if pool is not None:
            labels[LABEL_POOL] = pool
        context = {
            "ms": ms,
            "replicas": replicas,
            "labels": labels,
            "selector": server_selector(ms.name),
            "owner": _owner("ModelServer", ms.name, owner_uid),
            "resources": _server_resources(ms, device_claim is not None),
            "device_claim": device_claim,
            "pod_claim": POD_CLAIM,
            "share_args": list(vllm_share.utilization_args(ms.args, gpu_footprint,
                                                           device_memory)
                               if ms.runtime == "vllm" else ()),
            "readiness_path": readiness_path(ms),
            "routers": sorted(set(routers)),
            "slot_gate": SLOT_GATE if pool is not None else None,
            "gpu_footprint": gpu_footprint,
            "kv_mount": KV_CACHE_MOUNT_PATH,
            "kv_claim_name": kv_claim_name(ms),
            "kv_claim": _kv_claim(ms),
            "kv_clean": self._kv_clean(ms, owner_uid),
            "kv_files": self._kv_files(ms),
            "label_router": LABEL_ROUTER,
            "reconciler_namespace": self.reconciler_namespace,
            "reconciler_name": RECONCILER_NAME,
        }
        return self._render(_SERVER_TEMPLATES, context)

    def _kv_clean(self, ms: ModelServerSpec, owner_uid: str | None) -> dict[str, Any] | None:
        """The init container that removes a persisted member's stale slot files (the
        product's image, `modelpool-kv-clean`); None without persist or a UID."""
        kv = ms.kv_cache
        uid = ms.uid or owner_uid
        if kv is None or kv_claim_name(ms) is None or not uid:
            return None
        args = ["--dir", KV_CACHE_MOUNT_PATH, "--member", ms.name, "--uid", uid,
                "--max-age", f"{kv.max_age:g}"]
        if kv.max_bytes is not None:
            args += ["--max-size", str(kv.max_bytes)]
        return {"image": self.router_image, "args": args}

    def _kv_files(self, ms: ModelServerSpec) -> dict[str, Any] | None:
        """The container beside a persisted member's server that removes the slot files no
        manifest names (the product's image, `modelpool-kv-files`); None without persist."""
        if kv_claim_name(ms) is None:
            return None
        port = kv_files_port(ms)
        return {"image": self.router_image, "port": port,
                "args": ["--dir", KV_CACHE_MOUNT_PATH, "--port", str(port)]}

    def prewarm_pod(self, ms: ModelServerSpec, *, pool: str, pool_uid: str | None, node: str,
                    deadline: float) -> dict[str, Any] | None:
        """The pod that reads `ms`'s weights into `node`'s page cache during a swap of
        `pool` to it (None when `ms` keeps its weights on no volume: nothing to read)."""
        if ms.storage is None:
            return None
        mount = ms.storage.mount_path.rstrip("/") or "/"
        model = ms.model or ""
        inside = model == mount or model.startswith(mount + "/")
        labels = {
            "app.kubernetes.io/name": "model-server",
            "app.kubernetes.io/instance": ms.name,
            "app.kubernetes.io/component": "prewarm",
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            LABEL_PREWARM: pool,
        }
        context = {
            "ms": ms,
            "name": prewarm_pod_name(pool),
            "labels": labels,
            "owner": _owner("ModelPool", pool, pool_uid),
            "node": node,
            "path": model if inside else mount,
            "deadline": max(1, math.ceil(deadline)),
        }
        (pod,) = self._render((_PREWARM_TEMPLATE,), context)
        return pod

    def pool_claim(self, pool: ModelPoolSpec, *, owner_uid: str | None) -> dict[str, Any]:
        """A claim pool's ResourceClaim, which its members' pods reference by name."""
        if pool.claim is None:
            raise RenderError(f"ModelPool {pool.name} has no spec.device.claim")
        context = {
            "pool": pool,
            "name": claim_name(pool.name),
            "request": REQUEST,
            "labels": {
                "app.kubernetes.io/name": "model-pool",
                "app.kubernetes.io/instance": pool.name,
                "app.kubernetes.io/part-of": PART_OF,
                "app.kubernetes.io/managed-by": MANAGED_BY,
                LABEL_POOL: pool.name,
            },
            "owner": _owner("ModelPool", pool.name, owner_uid),
        }
        (claim,) = self._render((_CLAIM_TEMPLATE,), context)
        return claim

    def router(
        self,
        router: ModelRouterSpec,
        *,
        servers: Mapping[str, ModelServerSpec],
        pools: Sequence[ModelPoolSpec],
        owner_uid: str | None,
    ) -> list[dict[str, Any]]:
        """The router's objects: ServiceAccount, Role (its rules per
        `router_watches_servers`), RoleBinding, ConfigMap, Deployment and Service.
        `servers` maps the namespace's ModelServer names to specs and `pools` are its
        ModelPools; a backend naming a missing ModelServer, or a member in two pools,
        raises RenderError."""
        config_text = config_json(router_config(router, servers, pools))
        context = {
            "router": router,
            "name": router_object_name(router.name),
            "image": router.proxy.image or self.router_image,
            "command": list(ROUTER_COMMAND),
            "config_map": config_map_name(router.name),
            "config_key": CONFIG_KEY,
            "config_text": config_text,
            "config_hash": config_hash(config_text),
            "config_dir": ROUTER_CONFIG_DIR,
            "keys_dir": ROUTER_KEYS_DIR,
            "config_hash_annotation": CONFIG_HASH_ANNOTATION,
            "http_port": ROUTER_HTTP_PORT,
            "metrics_port": ROUTER_METRICS_PORT,
            "watches_servers": router_watches_servers(router),
            "labels": {
                "app.kubernetes.io/name": "modelpool-router",
                "app.kubernetes.io/instance": router.name,
                "app.kubernetes.io/part-of": PART_OF,
                "app.kubernetes.io/managed-by": MANAGED_BY,
                LABEL_ROUTER: router.name,
            },
            "selector": router_selector(router.name),
            "owner": _owner("ModelRouter", router.name, owner_uid),
        }
        return self._render(_ROUTER_TEMPLATES, context)


def kv_files_port(ms: ModelServerSpec) -> int:
    """The port of a persisted member's kv-files container: KV_FILES_PORT, or the next one
    when the server itself listens there."""
    return KV_FILES_PORT if ms.port != KV_FILES_PORT else KV_FILES_PORT + 1


def kv_claim_name(ms: ModelServerSpec) -> str | None:
    """The claim a persisted llama.cpp member's slots are saved to (None: no persist)."""
    kv = ms.kv_cache
    if kv is None or not kv.persist or ms.runtime != "llamacpp":
        return None
    return kv.claim(ms.name)


def _kv_claim(ms: ModelServerSpec) -> dict[str, str] | None:
    """The claim the reconciler creates for it, when it names a storage class."""
    kv = ms.kv_cache
    name = kv_claim_name(ms)
    if kv is None or name is None or kv.storage_class is None:
        return None
    return {"name": name, "storage_class": kv.storage_class,
            "size": format_bytes(kv.storage_size)}
