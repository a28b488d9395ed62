"""A pod's files: its volumes, its projected tokens and its kubeconfig.

The volume-manager half of the kubelet: `PodFiles` fetches the objects a pod refers to,
requests its ServiceAccount tokens (TokenRequest, bound to the pod, renewed at 80% of
their lifetime), writes each volume under the pod's directory and works out where each
container's mount paths point. What the files hold is decided by `volumes.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from e2e.local.node_agent import files
from e2e.local.node_agent.kube import Kube
from e2e.local.node_agent.objects import ObjectCache
from e2e.local.node_agent.podspec import (
    ConfigError,
    Json,
    Mount,
    PodFacts,
    Sources,
    referenced_objects,
)
from e2e.local.node_agent.settings import AgentSettings
from e2e.local.node_agent.volumes import (
    TokenSource,
    claim_path,
    plan_volume,
    token_kubeconfig,
    token_sources,
)


@dataclass(frozen=True)
class Token:
    text: str
    refresh_at: float


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def all_containers(pod: Json) -> list[Json]:
    spec = pod["spec"]
    return [*(spec.get("initContainers") or []), *spec["containers"]]


class PodFiles:
    def __init__(
        self,
        kube: Kube,
        objects: ObjectCache,
        settings: AgentSettings,
        directory: Path,
        log: logging.LoggerAdapter[Any],
    ) -> None:
        self.kube = kube
        self.objects = objects
        self.settings = settings
        self.directory = directory
        self.log = log
        self.tokens: dict[TokenSource, Token] = {}
        self.mounts: Mapping[str, list[Mount]] = {}
        self.kubeconfig: Path | None = None

    async def sources(self, pod: Json) -> Sources:
        """The ConfigMaps and Secrets the pod refers to, as they are now (None: absent)."""
        namespace = pod["metadata"]["namespace"]
        config_maps, secrets = referenced_objects(pod)
        found_maps: dict[str, Json | None] = {}
        found_secrets: dict[str, Json | None] = {}
        for name in sorted(config_maps):
            found_maps[name] = await self.objects.get("configmaps", namespace, name)
        for name in sorted(secrets):
            secret = await self.objects.get("secrets", namespace, name)
            # List items carry no kind; the decoding of Secret data depends on it.
            found_secrets[name] = None if secret is None else {**secret, "kind": "Secret"}
        return Sources(config_maps=found_maps, secrets=found_secrets)

    async def refresh_tokens(self, pod: Json) -> bool:
        """Request each projected token that is missing or due; True when any changed."""
        kube = self.kube
        meta, spec = pod["metadata"], pod["spec"]
        changed = False
        for volume in spec.get("volumes") or []:
            for source in token_sources(volume):
                current = self.tokens.get(source)
                if current is not None and time.time() < current.refresh_at:
                    continue
                text, expiry = await kube.request_token(
                    meta["namespace"],
                    spec.get("serviceAccountName", "default"),
                    meta["name"],
                    meta["uid"],
                    source.audience,
                    source.expiration_seconds,
                )
                now = time.time()
                lifetime = max(_parse_time(expiry) - now, 10.0)
                self.tokens[source] = Token(text=text, refresh_at=now + 0.8 * lifetime)
                changed = True
        return changed

    async def write(self, pod: Json, facts: PodFacts, sources: Sources) -> None:
        """Write every volume and the kubeconfig, and work out each container's mounts."""
        settings = self.settings
        namespace = pod["metadata"]["namespace"]
        containers = {c["name"]: c for c in all_containers(pod)}
        tokens = {source: token.text for source, token in self.tokens.items()}
        volume_dirs: dict[str, str] = {}
        for volume in pod["spec"].get("volumes") or []:
            plan = plan_volume(
                volume, facts, sources, containers, tokens, settings.api_server.ca_pem
            )
            directory = self.directory / "volumes" / plan.name
            if plan.kind == "host":
                volume_dirs[plan.name] = plan.host_path
                continue
            if plan.kind == "claim":
                volume_dirs[plan.name] = await self.claim_dir(namespace, plan.claim)
                continue
            if plan.kind == "empty":
                files.ensure_dir(directory)
            elif plan.kind == "files":
                first = files.current_files(directory) is None
                if files.write_atomically(directory, plan.files) and not first:
                    self.log.info("volume %s updated", plan.name)
            volume_dirs[plan.name] = str(directory)
        default_token = next((t for s, t in self.tokens.items() if s.audience == ""), None)
        if default_token is not None:
            config = token_kubeconfig(
                settings.api_server.server,
                settings.api_server.ca_data,
                default_token.text,
                namespace,
            )
            self.kubeconfig = self.directory / "kubeconfig"
            files.write_file_atomically(
                self.kubeconfig, yaml.safe_dump(config, sort_keys=False).encode()
            )
        mounts_of: dict[str, list[Mount]] = {}
        for container in all_containers(pod):
            mounts = []
            for mount in container.get("volumeMounts") or []:
                host = volume_dirs.get(mount["name"])
                if host is None:
                    raise ConfigError(f"volumeMount {mount['name']!r} names no volume")
                if mount.get("subPath"):
                    host = f"{host}/{mount['subPath']}"
                mounts.append(Mount(container_path=mount["mountPath"], host_path=host))
            mounts_of[container["name"]] = mounts
        self.mounts = mounts_of

    async def claim_dir(self, namespace: str, claim: str) -> str:
        """The directory of a PersistentVolumeClaim (ConfigError while it is unbound)."""
        kube = self.kube
        found = await kube.get("v1", f"namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if found is None:
            raise ConfigError(f'persistentvolumeclaim "{claim}" not found')
        bound = (found.get("spec") or {}).get("volumeName")
        volume = await kube.get("v1", f"persistentvolumes/{bound}") if bound else None
        path = claim_path(
            volume, str(self.settings.state_dir / "claims"), namespace, claim
        )
        files.ensure_dir(Path(path))
        return path

    async def sync(self, pod: Json, facts: PodFacts) -> None:
        await self.refresh_tokens(pod)
        await self.write(pod, facts, await self.sources(pod))
