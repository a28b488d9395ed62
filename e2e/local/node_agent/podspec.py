"""Turn a container spec into an argv and an environment, as the kubelet would.

Pure: every object the container refers to (ConfigMaps, Secrets, the pod's address) is
passed in, so each rule of docs/contracts.md section 3 is a function with a table test.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

Json = Mapping[str, Any]


class ConfigError(Exception):
    """The container cannot be configured (the kubelet's CreateContainerConfigError)."""


def program_argv(
    python: str, program: Sequence[str], command: Sequence[str], args: Sequence[str]
) -> list[str]:
    """The interpreter and its program, then `command[1:]`, then `args`.

    `command[0]` is the image's own entrypoint and is dropped; a Python-style command
    (`python3 -m vllm.entrypoints.openai.api_server --model x`) drops everything up to
    its first `--flag`, since the module it names is replaced by the program.
    """
    rest: list[str] = []
    if command:
        rest = list(command[1:])
        if PurePosixPath(command[0]).name.startswith("python"):
            flags = [i for i, word in enumerate(rest) if word.startswith("--")]
            rest = rest[flags[0] :] if flags else []
    return [python, *program, *rest, *args]


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` escapes a `$`,
    undefined references and unterminated ones stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    """A container path and the host directory (or file) that stands for it."""

    container_path: str
    host_path: str


def rewrite_paths(text: str, mounts: Sequence[Mount]) -> str:
    """Replace every mount path used as a path prefix (`/etc/cfg`, `/etc/cfg/a.json`,
    `--config=/etc/cfg/a.json`) with its host directory. Longer mount paths win, and
    the text is read once: a host directory put in is never rewritten again (one under
    `/tmp` where `/tmp` is also a mount)."""
    hosts: dict[str, str] = {}
    for mount in sorted(mounts, key=lambda m: len(m.container_path), reverse=True):
        prefix = mount.container_path.rstrip("/") or "/"
        if prefix != "/":
            hosts.setdefault(prefix, mount.host_path)
    if not hosts:
        return text
    pattern = re.compile(r"(?<![\w.\-/])(" + "|".join(re.escape(p) for p in hosts)
                         + r")(?=/|$|[^\w.\-])")
    return pattern.sub(lambda m: hosts[m.group(1)], text)


@dataclass(frozen=True)
class PodFacts:
    """What the downward API can say about a pod."""

    name: str
    namespace: str
    uid: str
    node_name: str
    service_account: str
    pod_ip: str
    host_ip: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


def pod_facts(pod: Json, pod_ip: str, host_ip: str) -> PodFacts:
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    return PodFacts(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid", ""),
        node_name=spec.get("nodeName", ""),
        service_account=spec.get("serviceAccountName", "default"),
        pod_ip=pod_ip,
        host_ip=host_ip,
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
    )


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(path: str, facts: PodFacts) -> str:
    """A `fieldRef.fieldPath` as the kubelet resolves it."""
    simple = {
        "metadata.name": facts.name,
        "metadata.namespace": facts.namespace,
        "metadata.uid": facts.uid,
        "spec.nodeName": facts.node_name,
        "spec.serviceAccountName": facts.service_account,
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return simple[path]
    if path in ("metadata.labels", "metadata.annotations"):
        values = facts.labels if path.endswith("labels") else facts.annotations
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    match = _SUBSCRIPT.match(path)
    if match:
        values = facts.labels if match.group(1) == "labels" else facts.annotations
        return values.get(match.group(2), "")
    raise ConfigError(f"unsupported fieldRef {path!r}")


def resource_value(ref: Json, container: Json) -> str:
    """A `resourceFieldRef` from the container's own requests and limits (divisor 1)."""
    kind, _, name = str(ref.get("resource", "")).partition(".")
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    source = limits if kind == "limits" else requests
    value = source.get(name, limits.get(name))
    if value is None:
        raise ConfigError(f"resourceFieldRef {ref.get('resource')!r} has no value")
    return str(value)


def object_data(obj: Json | None) -> dict[str, str]:
    """A ConfigMap's or Secret's data as text (Secret values and binaryData decoded)."""
    if obj is None:
        return {}
    decoded = obj.get("kind") == "Secret"
    out: dict[str, str] = {}
    for key, value in (obj.get("data") or {}).items():
        out[key] = base64.b64decode(value).decode("utf-8", "replace") if decoded else value
    for key, value in (obj.get("binaryData") or {}).items():
        out[key] = base64.b64decode(value).decode("utf-8", "replace")
    return out


@dataclass(frozen=True)
class Sources:
    """The objects an environment may draw on, fetched beforehand: None = absent."""

    config_maps: Mapping[str, Json | None]
    secrets: Mapping[str, Json | None]


def referenced_objects(pod: Json) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets that the pod's env and volumes refer to."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    spec = pod.get("spec", {})
    for container in spec.get("containers", []):
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                config_maps.add(source["configMapRef"]["name"])
            if "secretRef" in source:
                secrets.add(source["secretRef"]["name"])
        for var in container.get("env") or []:
            value_from = var.get("valueFrom") or {}
            if "configMapKeyRef" in value_from:
                config_maps.add(value_from["configMapKeyRef"]["name"])
            if "secretKeyRef" in value_from:
                secrets.add(value_from["secretKeyRef"]["name"])
    for volume in spec.get("volumes") or []:
        if "configMap" in volume:
            config_maps.add(volume["configMap"]["name"])
        if "secret" in volume:
            secrets.add(volume["secret"]["secretName"])
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "configMap" in source:
                config_maps.add(source["configMap"]["name"])
            if "secret" in source:
                secrets.add(source["secret"]["name"])
    return config_maps, secrets


def _key_ref(ref: Json, objects: Mapping[str, Json | None], kind: str) -> str | None:
    obj = objects.get(ref["name"])
    optional = bool(ref.get("optional", False))
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind} "{ref["name"]}" not found')
    data = object_data(obj)
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f'couldn\'t find key {ref["key"]} in {kind} {ref["name"]}')
    return data[ref["key"]]


def container_env(
    container: Json, facts: PodFacts, sources: Sources, injected: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment: `envFrom`, then `env` in order (each value expanded
    against the variables before it), then what the agent injects, which wins."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref, objects, kind = source["configMapRef"], sources.config_maps, "configmap"
        elif "secretRef" in source:
            ref, objects, kind = source["secretRef"], sources.secrets, "secret"
        else:
            continue
        obj = objects.get(ref["name"])
        if obj is None and not ref.get("optional", False):
            raise ConfigError(f'{kind} "{ref["name"]}" not found')
        for key, data in object_data(obj).items():
            env[prefix + key] = data
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        value_from = var["valueFrom"]
        value: str | None
        if "fieldRef" in value_from:
            value = field_value(value_from["fieldRef"]["fieldPath"], facts)
        elif "resourceFieldRef" in value_from:
            value = resource_value(value_from["resourceFieldRef"], container)
        elif "configMapKeyRef" in value_from:
            value = _key_ref(value_from["configMapKeyRef"], sources.config_maps, "configmap")
        elif "secretKeyRef" in value_from:
            value = _key_ref(value_from["secretKeyRef"], sources.secrets, "secret")
        else:
            raise ConfigError(f"unsupported valueFrom for {name}")
        if value is not None:
            env[name] = value
    env.update(injected)
    return env


def container_argv(
    python: str,
    program: Sequence[str],
    container: Json,
    env: Mapping[str, str],
    mounts: Sequence[Mount],
) -> list[str]:
    """argv with `$(VAR)` expanded and mount paths rewritten to host directories."""
    command = [expand(word, env) for word in container.get("command") or []]
    args = [expand(word, env) for word in container.get("args") or []]
    argv = program_argv(python, program, command, args)
    return argv[:1] + [rewrite_paths(word, mounts) for word in argv[1:]]


def rewrite_env(env: Mapping[str, str], mounts: Sequence[Mount]) -> dict[str, str]:
    return {key: rewrite_paths(value, mounts) for key, value in env.items()}


def gpu_request(container: Json, resource: str = "nvidia.com/gpu") -> int:
    """How many devices of `resource` the container asks for (limits win, as for
    extended resources requests must equal limits)."""
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(resource)
    if value is None:
        value = (resources.get("requests") or {}).get(resource)
    return int(str(value)) if value is not None else 0
