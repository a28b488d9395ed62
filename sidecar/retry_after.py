"""How long a client should wait before retrying a request the router could not hold.

A 503 from the activator carries `Retry-After`: a guess at when the member it asked for
will be resident, drawn from how long this pool's recent swaps took. Pure arithmetic, so
the activator's state machine can call it and tests can pin it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_RETRY_AFTER = 1.0
# With no swap seen yet, guess this share of the budget (a cold load is rarely instant).
_UNKNOWN_SHARE = 0.25


def typical_swap_seconds(recent: Sequence[float]) -> float | None:
    """The upper median of recent swap durations: robust to one slow outlier, and never
    shorter than the swap a client is most likely to be waiting for."""
    if not recent:
        return None
    ordered = sorted(recent)
    return ordered[len(ordered) // 2]


def retry_after_seconds(
    recent: Sequence[float], *, budget: float, elapsed: float | None = None
) -> float:
    """Whole seconds to wait, at least one and at most the swap budget.

    `elapsed` is how long the swap being waited for has already run (from the oldest held
    request), so a swap that is nearly done yields a short wait.
    """
    typical = typical_swap_seconds(recent)
    if typical is None:
        typical = budget * _UNKNOWN_SHARE
    remaining = typical - elapsed if elapsed is not None else typical
    upper = max(MIN_RETRY_AFTER, budget)
    return float(min(upper, max(MIN_RETRY_AFTER, math.ceil(remaining))))
