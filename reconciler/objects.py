"""Reading the Kubernetes objects the reconciler watches: their metadata and labels, a
pod's state, and whether a live object already holds what was rendered. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    return any(ref.get("uid") == uid for ref in meta(obj).get("ownerReferences") or [])


def covers(desired: Any, live: Any) -> bool:
    """Whether `live` already holds every field of `desired` (the server adds defaults,
    so extra fields are fine); scalars compare as text, as quantities do."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            covers(v, live.get(key)) for key, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(covers(d, v) for d, v in zip(desired, live, strict=True))
        )
    if desired is None:
        return live is None
    if isinstance(desired, bool) or isinstance(live, bool):
        return bool(desired == live)
    return str(desired) == str(live)


def pod_active(pod: Mapping[str, Any]) -> bool:
    """A pod that may still hold the GPU: anything not finished, terminating ones too."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if meta(pod).get("deletionTimestamp"):
        return False
    conditions: list[Mapping[str, Any]] = (pod.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False
