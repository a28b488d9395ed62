"""The three custom resources as frozen dataclasses, parsed once from their bodies.

The API server applies the CRD defaults before the reconciler sees an object, but the render
CLI reads files straight from git, so the same defaults are applied here too; both paths then
see identical specs. Durations arrive as Go-style strings ("1m30s") and leave as seconds;
GPU memory arrives as a quantity ("16Gi") and leaves as bytes (`reconciler.quantity`).
A body that does not fit raises `SpecError` naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from reconciler.quantity import QuantityError, format_bytes, parse_bytes

GROUP = "modelpool.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

RUNTIMES = ("llamacpp", "vllm", "generic")
SWAP_POLICIES = ("sticky", "fair", "reclaim")
HELD_STREAM_PROGRESS = ("Comment", "Content")
ACTIVATIONS = ("Wait", "IfIdle", "Never")
ROUTE_STRATEGIES = ("BackendNameMatch", "Static")

DEFAULT_PORT = 8080
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
# The DeviceClass of a pool's ResourceClaim unless it names another: NVIDIA's DRA driver's.
DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"
DEFAULT_MOUNT_PATH = "/models"
DEFAULT_SWAP_BUDGET = "300s"
# The product's one image, holding both programs, as the base installs it (manifests/): the
# router's image when neither the reconciler's setting (MODELPOOL_ROUTER_IMAGE, which the base
# sets to the reconciler's own image) nor a router's spec.proxy.image names another.
DEFAULT_ROUTER_IMAGE = "ghcr.io/modelpool/modelpool:0.1.0"
DEFAULT_RESPONSE_HEADER_TIMEOUT = "600s"
# After SIGTERM a router pod goes on accepting while kube-proxy catches up (see sidecar),
# then gives its requests in flight the grace period; the kubelet waits for both and more.
DEFAULT_SHUTDOWN_DELAY = "5s"
DEFAULT_SHUTDOWN_GRACE_PERIOD = "25s"
MAX_SHUTDOWN_SECONDS = 3600.0
TERMINATION_MARGIN_SECONDS = 5
DEFAULT_MAX_HELD_REQUESTS = 1000

# The grammar of the CRDs' duration pattern: one or more <number><unit>, no sign.
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_DURATION = re.compile(f"(?:{_DURATION_PART.pattern})+")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class SpecError(ValueError):
    """A custom resource body does not fit its schema; the message names the field."""


def parse_duration(text: str, field_name: str = "duration") -> float:
    """Seconds in a Go-style duration string such as "300s", "1m30s" or "1.5h"."""
    if not isinstance(text, str) or not _DURATION.fullmatch(text):
        raise SpecError(f"{field_name} must be a duration such as 300s or 1m30s, not {text!r}")
    return sum(
        float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(text)
    )


T = TypeVar("T")


def _typed(value: Any, typ: type[T], where: str, what: str) -> T:
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
        raise SpecError(f"{where} must be {what}, not {type(value).__name__}")
    return value


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _obj(body: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    return _typed(value, dict, _at(where, key), "an object")


def _list(body: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    return _typed(value, list, _at(where, key), "a list")


def _str(body: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    value = body.get(key)
    if value is None:
        return default
    return _typed(value, str, _at(where, key), "a string")


def _req_str(body: Mapping[str, Any], key: str, where: str) -> str:
    value = _str(body, key, where)
    if not value:
        raise SpecError(f"{where}.{key} is required")
    return value


def _int(body: Mapping[str, Any], key: str, where: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    return _typed(value, int, _at(where, key), "an integer")


def _enum(body: Mapping[str, Any], key: str, where: str, allowed: Sequence[str]) -> str:
    value = _str(body, key, where, allowed[0])
    if value not in allowed:
        raise SpecError(f"{where}.{key} must be one of {', '.join(allowed)}, not {value!r}")
    return value or allowed[0]


def _port(body: Mapping[str, Any], key: str, where: str) -> int:
    port = _int(body, key, where, DEFAULT_PORT)
    if not 1 <= port <= 65535:
        raise SpecError(f"{where}.{key} must be between 1 and 65535, not {port}")
    return port


def _duration(body: Mapping[str, Any], key: str, where: str, default: str | None,
              *, zero: bool = False) -> float | None:
    """Seconds of a positive duration (or 0 too, with `zero`)."""
    text = _str(body, key, where, default)
    if text is None:
        return None
    seconds = parse_duration(text, _at(where, key))
    if seconds <= 0 and not (zero and seconds == 0):
        raise SpecError(f"{where}.{key} must be a positive duration, not {text!r}")
    return seconds


def _quantity(body: Mapping[str, Any], key: str, where: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(f"{where}.{key} must be a quantity such as 4 or 16Gi")
    return str(value)


def _bytes(body: Mapping[str, Any], key: str, where: str) -> int | None:
    """Whole bytes of a positive quantity, or None when absent."""
    value = body.get(key)
    if value is None:
        return None
    try:
        return parse_bytes(value, _at(where, key))
    except QuantityError as e:
        raise SpecError(str(e)) from e


def _str_map(body: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    raw = _obj(body, key, where)
    for k, v in raw.items():
        _typed(v, str, f"{where}.{key}.{k}", "a string")
    return dict(raw)


def _str_list(body: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = _list(body, key, where)
    return tuple(_typed(v, str, f"{where}.{key}[{i}]", "a string") for i, v in enumerate(items))


def _require_unique(names: Sequence[str], where: str) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"{where} names must be unique: {', '.join(duplicates)}")


def _obj_list(body: Mapping[str, Any], key: str, where: str) -> tuple[dict[str, Any], ...]:
    items = _list(body, key, where)
    return tuple(dict(_typed(v, dict, f"{where}.{key}[{i}]", "an object"))
                 for i, v in enumerate(items))


@dataclass(frozen=True)
class ObjectRef:
    """namespace, name, uid and generation of the custom resource a spec came from."""

    namespace: str
    name: str
    uid: str | None
    generation: int


def _meta(body: Mapping[str, Any], kind: str) -> ObjectRef:
    if not isinstance(body, Mapping):
        raise SpecError(f"a {kind} must be an object")
    if body.get("kind", kind) != kind:
        raise SpecError(f"kind must be {kind}, not {body.get('kind')!r}")
    if body.get("metadata") is None:
        raise SpecError("metadata is required")
    meta = _obj(body, "metadata", "")
    return ObjectRef(
        namespace=_str(meta, "namespace", "metadata", "default") or "default",
        name=_req_str(meta, "name", "metadata"),
        uid=_str(meta, "uid", "metadata"),
        generation=_int(meta, "generation", "metadata", 0),
    )


def _spec(body: Mapping[str, Any]) -> Mapping[str, Any]:
    if body.get("spec") is None:
        raise SpecError("spec is required")
    return _obj(body, "spec", "")


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None = None
    value_from: Mapping[str, Any] | None = None

    def to_k8s(self) -> dict[str, Any]:
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": dict(self.value_from)}
        return {"name": self.name, "value": self.value or ""}


@dataclass(frozen=True)
class ServerResources:
    gpu: int = 1
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    cpu: str | None = None
    memory: str | None = None
    # The GPU memory the server takes when loaded, in bytes: its footprint in a budgeted pool.
    gpu_memory: int | None = None


@dataclass(frozen=True)
class Storage:
    """Where the weights live: a PersistentVolumeClaim or a node path, mounted at mount_path."""

    mount_path: str = DEFAULT_MOUNT_PATH
    pvc: str | None = None
    host_path: str | None = None
    read_only: bool = True


KV_CACHE_MOUNT_PATH = "/var/lib/modelpool/kv-cache"
DEFAULT_KV_SAVE_TIMEOUT = "10s"
DEFAULT_KV_MAX_AGE = "24h"
DEFAULT_KV_STORAGE_SIZE = 10 << 30  # the claim the reconciler creates: 10Gi
KV_CLAIM_SUFFIX = "-kv-cache"


@dataclass(frozen=True)
class KvCache:
    """A llama.cpp member's slots kept across an unload (spec.kvCache): saved on unload to
    the claim `pvc` (or, with `storage_class`, one the reconciler creates of
    `storage_size` bytes, owned by the ModelServer) and restored on load, within
    `max_bytes` of files and `save_timeout` of saving; files older than `max_age` are not
    restored."""

    persist: bool = False
    pvc: str | None = None
    max_bytes: int | None = None
    save_timeout: float = 10.0
    max_age: float = 86400.0
    storage_class: str | None = None
    storage_size: int = DEFAULT_KV_STORAGE_SIZE

    def claim(self, server: str) -> str | None:
        """The claim the slots are saved to: the one named, or the one created."""
        if self.pvc is not None:
            return self.pvc
        return server + KV_CLAIM_SUFFIX if self.storage_class is not None else None


@dataclass(frozen=True)
class IdleSpec:
    """How to tell a server is idle, as written in spec.idle (no runtime defaults applied)."""

    path: str | None = None
    metric: str | None = None
    threshold: float = 0.0


@dataclass(frozen=True)
class ModelServerSpec:
    namespace: str
    name: str
    uid: str | None
    generation: int
    runtime: str
    image: str
    model: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    port: int = DEFAULT_PORT
    resources: ServerResources = field(default_factory=ServerResources)
    storage: Storage | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    replicas: int = 1
    readiness_path: str | None = None
    idle: IdleSpec | None = None
    allow_direct_access: bool = False
    scratch: bool = True
    kv_cache: KvCache | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ModelServerSpec:
        ref = _meta(body, "ModelServer")
        spec = _spec(body)
        where = "spec"
        runtime = _enum(spec, "runtime", where, RUNTIMES)
        model = _str(spec, "model", where)
        if runtime != "generic" and not model:
            raise SpecError(f"spec.model is required for the {runtime} runtime")
        env = []
        for i, item in enumerate(_obj_list(spec, "env", where)):
            at = f"spec.env[{i}]"
            value_from = item.get("valueFrom")
            env.append(
                EnvVar(
                    name=_req_str(item, "name", at),
                    value=_str(item, "value", at),
                    value_from=None if value_from is None
                    else dict(_typed(value_from, dict, f"{at}.valueFrom", "an object")),
                )
            )
        res = _obj(spec, "resources", where)
        gpu = _int(res, "gpu", "spec.resources", 1)
        if gpu < 0:
            raise SpecError(f"spec.resources.gpu must not be negative, not {gpu}")
        storage = None
        raw_storage = _obj(spec, "storage", where)
        if raw_storage:
            pvc = _str(raw_storage, "pvc", "spec.storage")
            host_path = _str(raw_storage, "hostPath", "spec.storage")
            if (pvc is None) == (host_path is None):
                raise SpecError("spec.storage needs exactly one of pvc and hostPath")
            read_only = raw_storage.get("readOnly", True)
            storage = Storage(
                mount_path=_str(raw_storage, "mountPath", "spec.storage", DEFAULT_MOUNT_PATH)
                or DEFAULT_MOUNT_PATH,
                pvc=pvc,
                host_path=host_path,
                read_only=_typed(read_only, bool, "spec.storage.readOnly", "a boolean"),
            )
        idle = None
        raw_idle = _obj(spec, "idle", where)
        if raw_idle:
            threshold = raw_idle.get("threshold", 0)
            if isinstance(threshold, bool) or not isinstance(threshold, int | float):
                raise SpecError("spec.idle.threshold must be a number")
            idle = IdleSpec(
                path=_str(raw_idle, "path", "spec.idle"),
                metric=_str(raw_idle, "metric", "spec.idle"),
                threshold=float(threshold),
            )
        replicas = _int(spec, "replicas", where, 1)
        if replicas < 0:
            raise SpecError(f"spec.replicas must not be negative, not {replicas}")
        kv_cache = None
        raw_kv = _obj(spec, "kvCache", where)
        if raw_kv:
            if runtime != "llamacpp":
                raise SpecError(f"spec.kvCache needs runtime llamacpp (slot save and restore), "
                                f"not {runtime}")
            persist = _typed(raw_kv.get("persist", False), bool, "spec.kvCache.persist",
                             "a boolean")
            kv_pvc = _str(raw_kv, "pvc", "spec.kvCache")
            kv_class = _str(raw_kv, "storageClassName", "spec.kvCache")
            if kv_pvc is not None and kv_class is not None:
                raise SpecError("spec.kvCache names both pvc and storageClassName: a claim "
                                "of yours or one the reconciler creates, not both")
            if persist and kv_pvc is None and kv_class is None:
                raise SpecError("spec.kvCache.persist needs spec.kvCache.pvc, the "
                                "PersistentVolumeClaim the slots are saved to, or "
                                "spec.kvCache.storageClassName, for a claim the reconciler "
                                "creates")
            kv_cache = KvCache(
                persist=persist,
                pvc=kv_pvc,
                storage_class=kv_class,
                storage_size=_bytes(raw_kv, "storageSize", "spec.kvCache")
                or DEFAULT_KV_STORAGE_SIZE,
                max_bytes=_bytes(raw_kv, "maxSize", "spec.kvCache"),
                save_timeout=_duration(raw_kv, "saveTimeout", "spec.kvCache",
                                       DEFAULT_KV_SAVE_TIMEOUT) or 10.0,
                max_age=_duration(raw_kv, "maxAge", "spec.kvCache", DEFAULT_KV_MAX_AGE)
                or 86400.0,
            )
        return cls(
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            generation=ref.generation,
            runtime=runtime,
            image=_req_str(spec, "image", where),
            model=model,
            args=_str_list(spec, "args", where),
            env=tuple(env),
            port=_port(spec, "port", where),
            resources=ServerResources(
                gpu=gpu,
                gpu_resource=_str(res, "gpuResource", "spec.resources", DEFAULT_GPU_RESOURCE)
                or DEFAULT_GPU_RESOURCE,
                cpu=_quantity(res, "cpu", "spec.resources"),
                memory=_quantity(res, "memory", "spec.resources"),
                gpu_memory=_bytes(res, "gpuMemory", "spec.resources"),
            ),
            storage=storage,
            node_selector=_str_map(spec, "nodeSelector", where),
            tolerations=_obj_list(spec, "tolerations", where),
            replicas=replicas,
            readiness_path=_str(spec, "readinessPath", where),
            idle=idle,
            allow_direct_access=_typed(spec.get("allowDirectAccess", False), bool,
                                       "spec.allowDirectAccess", "a boolean"),
            scratch=_typed(spec.get("scratch", True), bool, "spec.scratch", "a boolean"),
            kv_cache=kv_cache,
        )


@dataclass(frozen=True)
class PoolMember:
    name: str
    priority: int = 0
    # The member's footprint in bytes as the pool's entry states it; None: the ModelServer's.
    gpu_memory: int | None = None


@dataclass(frozen=True)
class DeviceClaim:
    """A budgeted pool's device, shared through one ResourceClaim the pool owns."""

    device_class_name: str = DEFAULT_DEVICE_CLASS


@dataclass(frozen=True)
class ModelPoolSpec:
    namespace: str
    name: str
    uid: str | None
    generation: int
    members: tuple[PoolMember, ...]
    default: str | None = None
    swap_policy: str = "sticky"
    swap_budget_seconds: float = 300.0
    min_residency_seconds: float = 0.0
    max_wait_seconds: float | None = None
    reclaim_after_seconds: float | None = None
    idle_unload_after_seconds: float | None = None
    prewarm: bool = True
    # The memory of the pool's device its members may use, in bytes; None: an exclusive
    # pool, or a claim pool whose budget is its device's memory.
    gpu_memory: int | None = None
    # spec.device.claim: the members share one device through the pool's ResourceClaim;
    # None: through the GPU resource of a device plugin (exclusive, or shares of one).
    claim: DeviceClaim | None = None

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    @property
    def budgeted(self) -> bool:
        """Whether the pool counts its members by memory: a budget stated, or a device
        claimed (whose memory is the budget where none is stated)."""
        return self.gpu_memory is not None or self.claim is not None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ModelPoolSpec:
        ref = _meta(body, "ModelPool")
        spec = _spec(body)
        where = "spec"
        gpu_memory = _bytes(spec, "gpuMemory", where)
        members = []
        for i, item in enumerate(_obj_list(spec, "members", where)):
            at = f"spec.members[{i}]"
            footprint = _bytes(item, "gpuMemory", at)
            if gpu_memory is not None and footprint is not None and footprint > gpu_memory:
                raise SpecError(f"{at}.gpuMemory ({format_bytes(footprint)}) must not exceed "
                                f"spec.gpuMemory ({format_bytes(gpu_memory)})")
            members.append(PoolMember(_req_str(item, "name", at), _int(item, "priority", at, 0),
                                      footprint))
        if not members:
            raise SpecError("spec.members must list at least one member")
        names = [m.name for m in members]
        _require_unique(names, "spec.members")
        default = _str(spec, "default", where)
        if default is not None and default not in names:
            raise SpecError(f"spec.default {default!r} must be one of spec.members")
        policy = _enum(spec, "swapPolicy", where, SWAP_POLICIES)
        budget = _duration(spec, "swapBudget", where, DEFAULT_SWAP_BUDGET)
        assert budget is not None  # it has a default
        max_wait = _duration(spec, "maxWait", where, None)
        reclaim_after = _duration(spec, "reclaimAfter", where, None)
        if policy == "fair" and max_wait is None:
            raise SpecError("spec.maxWait is required when spec.swapPolicy is fair")
        if policy == "reclaim" and (default is None or reclaim_after is None):
            raise SpecError("spec.default and spec.reclaimAfter are required when "
                            "spec.swapPolicy is reclaim")
        return cls(
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            generation=ref.generation,
            members=tuple(members),
            default=default,
            swap_policy=policy,
            swap_budget_seconds=budget,
            min_residency_seconds=_duration(spec, "minResidency", where, None) or 0.0,
            max_wait_seconds=max_wait,
            reclaim_after_seconds=reclaim_after,
            idle_unload_after_seconds=_duration(spec, "idleUnloadAfter", where, None),
            prewarm=_typed(spec.get("prewarm", True), bool, "spec.prewarm", "a boolean"),
            gpu_memory=gpu_memory,
            claim=_device_claim(spec),
        )


def _device_claim(spec: Mapping[str, Any]) -> DeviceClaim | None:
    """spec.device.claim, with its default device class; None without one."""
    device = _obj(spec, "device", "spec")
    if device.get("claim") is None:
        return None
    claim = _obj(device, "claim", "spec.device")
    name = _str(claim, "deviceClassName", "spec.device.claim", DEFAULT_DEVICE_CLASS)
    if not name:
        raise SpecError("spec.device.claim.deviceClassName must not be empty")
    return DeviceClaim(name)


@dataclass(frozen=True)
class RouterBackend:
    name: str
    model_server_ref: str | None = None
    url: str | None = None
    aliases: tuple[str, ...] = ()
    activation: str = "Wait"  # Wait | IfIdle | Never (sidecar.fallback)
    fallback: str | None = None  # the backend that answers instead
    fallback_model: str | None = None  # the model it is sent (None: the client's)


def _check_fallbacks(backends: Sequence[RouterBackend]) -> None:
    """Every fallback names a backend, and no chain of fallbacks comes back on itself."""
    by_name = {b.name: b for b in backends}
    for i, b in enumerate(backends):
        if b.fallback is not None and b.fallback not in by_name:
            raise SpecError(f"spec.backends[{i}].fallback.name {b.fallback!r} must name a backend")
    for b in backends:
        chain = [b.name]
        current = b
        while current.fallback is not None:
            current = by_name[current.fallback]
            if current.name in chain:
                raise SpecError("spec.backends fall back in a loop: "
                                + " -> ".join([*chain, current.name]))
            chain.append(current.name)


@dataclass(frozen=True)
class ProxySpec:
    replicas: int = 1
    image: str | None = None  # None: the reconciler's router image
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    resources: Mapping[str, Any] = field(default_factory=dict)
    port: int = DEFAULT_PORT
    response_header_timeout_seconds: float = 600.0
    max_held_requests: int = DEFAULT_MAX_HELD_REQUESTS
    api_key_secret: ApiKeySecret | None = None
    held_stream_progress: str = "Comment"
    shutdown_delay_seconds: float = 5.0
    shutdown_grace_period_seconds: float = 25.0

    @property
    def termination_grace_period_seconds(self) -> int:
        """The pod's: the shutdown delay and grace period, and a margin for the exit."""
        return math.ceil(self.shutdown_delay_seconds + self.shutdown_grace_period_seconds) + (
            TERMINATION_MARGIN_SECONDS)


@dataclass(frozen=True)
class ApiKeySecret:
    """The Secret (and its key) whose lines are the API keys the router accepts."""

    name: str
    key: str = "keys"


@dataclass(frozen=True)
class ModelRouterSpec:
    namespace: str
    name: str
    uid: str | None
    generation: int
    backends: tuple[RouterBackend, ...]
    default_route: str | None = None
    route_strategy: str = "BackendNameMatch"
    proxy: ProxySpec = field(default_factory=ProxySpec)

    @property
    def model_server_refs(self) -> tuple[str, ...]:
        """The ModelServer names this router's backends refer to, in backend order."""
        return tuple(b.model_server_ref for b in self.backends if b.model_server_ref)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ModelRouterSpec:
        ref = _meta(body, "ModelRouter")
        spec = _spec(body)
        where = "spec"
        backends = []
        for i, item in enumerate(_obj_list(spec, "backends", where)):
            at = f"spec.backends[{i}]"
            server_ref = _obj(item, "modelServerRef", at)
            fallback = _obj(item, "fallback", at)
            backend = RouterBackend(
                name=_req_str(item, "name", at),
                model_server_ref=_req_str(server_ref, "name", f"{at}.modelServerRef")
                if server_ref else None,
                url=_str(item, "url", at),
                aliases=_str_list(item, "aliases", at),
                activation=_enum(item, "activation", at, ACTIVATIONS),
                fallback=_req_str(fallback, "name", f"{at}.fallback") if fallback else None,
                fallback_model=_str(fallback, "model", f"{at}.fallback") if fallback else None,
            )
            if (backend.model_server_ref is None) == (backend.url is None):
                raise SpecError(f"{at} needs exactly one of modelServerRef and url")
            backends.append(backend)
        if not backends:
            raise SpecError("spec.backends must list at least one backend")
        names = [b.name for b in backends]
        _require_unique(names, "spec.backends")
        _check_fallbacks(backends)
        default_route = _str(spec, "defaultRoute", where)
        if default_route is not None and default_route not in names:
            raise SpecError(f"spec.defaultRoute {default_route!r} must name a backend")
        strategy = _enum(spec, "routeStrategy", where, ROUTE_STRATEGIES)
        if strategy == "Static" and default_route is None:
            raise SpecError("spec.defaultRoute is required when spec.routeStrategy is Static")
        proxy = _obj(spec, "proxy", where)
        at = "spec.proxy"
        timeout = _duration(proxy, "responseHeaderTimeout", at, DEFAULT_RESPONSE_HEADER_TIMEOUT)
        assert timeout is not None  # it has a default
        replicas = _int(proxy, "replicas", at, 1)
        if replicas < 0:
            raise SpecError(f"spec.proxy.replicas must not be negative, not {replicas}")
        keys = _obj(proxy, "apiKeySecret", at)
        api_key_secret = (
            ApiKeySecret(
                name=_req_str(keys, "name", f"{at}.apiKeySecret"),
                key=_str(keys, "key", f"{at}.apiKeySecret", "keys") or "keys",
            )
            if keys
            else None
        )
        progress = _enum(proxy, "heldStreamProgress", at, HELD_STREAM_PROGRESS)
        delay = _duration(proxy, "shutdownDelay", at, DEFAULT_SHUTDOWN_DELAY, zero=True)
        grace = _duration(proxy, "shutdownGracePeriod", at, DEFAULT_SHUTDOWN_GRACE_PERIOD)
        assert delay is not None and grace is not None  # they have defaults
        for key, seconds in (("shutdownDelay", delay), ("shutdownGracePeriod", grace)):
            if seconds > MAX_SHUTDOWN_SECONDS:
                raise SpecError(f"{at}.{key} must be at most 1h, not {seconds:g}s")
        max_held = _int(proxy, "maxHeldRequests", at, DEFAULT_MAX_HELD_REQUESTS)
        if max_held < 1:
            raise SpecError(f"spec.proxy.maxHeldRequests must be at least 1, not {max_held}")
        return cls(
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            generation=ref.generation,
            backends=tuple(backends),
            default_route=default_route,
            route_strategy=strategy,
            proxy=ProxySpec(
                replicas=replicas,
                image=_str(proxy, "image", at) or None,
                node_selector=_str_map(proxy, "nodeSelector", at),
                tolerations=_obj_list(proxy, "tolerations", at),
                resources=dict(_obj(proxy, "resources", at)),
                port=_port(proxy, "port", at),
                response_header_timeout_seconds=timeout,
                max_held_requests=max_held,
                api_key_secret=api_key_secret,
                held_stream_progress=progress,
                shutdown_delay_seconds=delay,
                shutdown_grace_period_seconds=grace,
            ),
        )
