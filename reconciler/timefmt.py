"""Timestamps as Kubernetes writes them (RFC 3339, UTC, whole seconds) and back.

The swap keeps time as float seconds since the epoch so that a state restored from
status after a restart or a leader hand-over compares with the clock it is given.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(seconds: float) -> str:
    """MicroTime, as events.k8s.io and Leases want it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp; None for None or garbage."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
