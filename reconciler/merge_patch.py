"""The merge patch that brings the status fields the reconciler owns to what it wants,
for every kind it writes status of (pools, servers, routers). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def status_patch(owned: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The merge patch taking `previous` to `owned`: only keys that differ, None to
    delete; empty when nothing changed (then nothing is written)."""
    previous = previous or {}
    patch: dict[str, Any] = {}
    for key, value in owned.items():
        before = previous.get(key)
        if isinstance(value, dict) and isinstance(before, Mapping):
            if _drop_none(value) != dict(before):
                patch[key] = _full_replace(value, before)
        elif value != before:
            patch[key] = value
    return patch


def _full_replace(value: dict[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch of a nested object replacing it whole: keys gone become None."""
    out = dict(value)
    for key in before:
        out.setdefault(key, None)
    return out


def _drop_none(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}
