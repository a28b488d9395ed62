"""What each pod volume holds, as files, before anything is written.

The kubelet turns ConfigMap, Secret, downward-API and projected volumes into files and
keeps them current; the node agent does the same under the pod's state directory. This
module only computes the contents (path -> bytes) so a test can read them off a pod
spec; `files.py` writes them atomically.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e.local.node_agent.podspec import (
    ConfigError,
    Json,
    PodFacts,
    Sources,
    field_value,
    resource_value,
)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class TokenSource:
    """A projected service-account token the volume needs (filled in by the shell)."""

    audience: str  # "" = the API server's own audience
    expiration_seconds: int


@dataclass(frozen=True)
class VolumePlan:
    """`kind` is `files` (contents below), `empty` (an emptyDir), `host` (hostPath,
    the path in `host_path`) or `claim` (a PersistentVolumeClaim, its name in `claim`)."""

    name: str
    kind: str
    files: Mapping[str, bytes] = field(default_factory=dict)
    host_path: str = ""
    claim: str = ""


def _raw_data(obj: Json) -> dict[str, bytes]:
    secret = obj.get("kind") == "Secret"
    out: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        out[key] = base64.b64decode(value) if secret else str(value).encode()
    for key, value in (obj.get("binaryData") or {}).items():
        out[key] = base64.b64decode(value)
    return out


def _object_files(
    source: Json, name: str, objects: Mapping[str, Json | None], kind: str
) -> dict[str, bytes]:
    obj = objects.get(name)
    optional = bool(source.get("optional", False))
    if obj is None:
        if optional:
            return {}
        raise ConfigError(f'{kind} "{name}" not found')
    data = _raw_data(obj)
    items: Sequence[Json] | None = source.get("items")
    if not items:
        return data
    out: dict[str, bytes] = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise ConfigError(f'{kind} "{name}" has no key {item["key"]!r}')
        out[item["path"]] = data[item["key"]]
    return out


def _downward_files(
    items: Sequence[Json], facts: PodFacts, containers: Mapping[str, Json]
) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for item in items:
        if "fieldRef" in item:
            out[item["path"]] = field_value(item["fieldRef"]["fieldPath"], facts).encode()
        elif "resourceFieldRef" in item:
            ref = item["resourceFieldRef"]
            container = containers.get(ref.get("containerName", ""), {})
            out[item["path"]] = resource_value(ref, container).encode()
    return out


def token_sources(volume: Json) -> list[TokenSource]:
    """The service-account tokens a projected volume asks for."""
    out = []
    for source in (volume.get("projected") or {}).get("sources") or []:
        token = source.get("serviceAccountToken")
        if token is not None:
            out.append(
                TokenSource(
                    audience=token.get("audience", ""),
                    expiration_seconds=int(token.get("expirationSeconds", 3600)),
                )
            )
    return out


def plan_volume(
    volume: Json,
    facts: PodFacts,
    sources: Sources,
    containers: Mapping[str, Json],
    tokens: Mapping[TokenSource, str],
    root_ca: bytes,
) -> VolumePlan:
    """The contents of one volume. `tokens` holds the token text of each TokenSource of
    the volume; `root_ca` stands in for `kube-root-ca.crt` when that ConfigMap is absent."""
    name = volume["name"]
    if "emptyDir" in volume:
        return VolumePlan(name=name, kind="empty")
    if "hostPath" in volume:
        return VolumePlan(name=name, kind="host", host_path=volume["hostPath"]["path"])
    if "persistentVolumeClaim" in volume:
        return VolumePlan(
            name=name, kind="claim", claim=volume["persistentVolumeClaim"]["claimName"]
        )
    if "configMap" in volume:
        source = volume["configMap"]
        return VolumePlan(
            name=name,
            kind="files",
            files=_object_files(source, source["name"], sources.config_maps, "configmap"),
        )
    if "secret" in volume:
        source = volume["secret"]
        return VolumePlan(
            name=name,
            kind="files",
            files=_object_files(source, source["secretName"], sources.secrets, "secret"),
        )
    if "downwardAPI" in volume:
        items = volume["downwardAPI"].get("items") or []
        return VolumePlan(name=name, kind="files", files=_downward_files(items, facts, containers))
    if "projected" in volume:
        files: dict[str, bytes] = {}
        for source in volume["projected"].get("sources") or []:
            if "configMap" in source:
                cm = source["configMap"]
                config_maps: Mapping[str, Any] = sources.config_maps
                if cm["name"] == "kube-root-ca.crt" and config_maps.get(cm["name"]) is None:
                    config_maps = {cm["name"]: {"data": {"ca.crt": root_ca.decode()}}}
                files.update(_object_files(cm, cm["name"], config_maps, "configmap"))
            elif "secret" in source:
                secret = source["secret"]
                files.update(_object_files(secret, secret["name"], sources.secrets, "secret"))
            elif "downwardAPI" in source:
                items = source["downwardAPI"].get("items") or []
                files.update(_downward_files(items, facts, containers))
            elif "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                key = TokenSource(
                    audience=token.get("audience", ""),
                    expiration_seconds=int(token.get("expirationSeconds", 3600)),
                )
                files[token["path"]] = tokens[key].encode()
        return VolumePlan(name=name, kind="files", files=files)
    raise ConfigError(f"volume {name!r}: unsupported volume type")


def claim_path(volume: Json | None, claims_dir: str, namespace: str, claim: str) -> str:
    """Where a claim's data lives: the bound PersistentVolume's hostPath or local path,
    else a directory of the node's own (as a local provisioner would make)."""
    spec = (volume or {}).get("spec") or {}
    for key in ("hostPath", "local"):
        if spec.get(key, {}).get("path"):
            return str(spec[key]["path"])
    return f"{claims_dir}/{namespace}_{claim}"


def token_kubeconfig(server: str, ca_data: str, token: str, namespace: str) -> dict[str, Any]:
    """A kubeconfig that authenticates as the pod's ServiceAccount."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority-data": ca_data}}
        ],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [
            {"name": "pod", "context": {"cluster": "local", "user": "pod", "namespace": namespace}}
        ],
        "current-context": "pod",
    }
