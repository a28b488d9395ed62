"""When an exited container runs again, and after how long (the kubelet's rules, with a
testbed-sized backoff)."""

from __future__ import annotations


def should_restart(policy: str, exit_code: int) -> bool:
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return exit_code != 0
    return False


def backoff_seconds(restart_count: int, base: float, cap: float) -> float:
    """Doubling delay before restart number `restart_count` (1 for the first)."""
    if restart_count <= 1:
        return base
    return float(min(cap, base * 2 ** (restart_count - 1)))
