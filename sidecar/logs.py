"""The router logs JSON lines through telemetry.logs; this name for its setup remains only
because benchmarks/bench_router.py configures an in-process router's logging through it.
Once that imports `telemetry.logs.configure_logging`, this module can go."""

from __future__ import annotations

from telemetry.logs import configure_logging as setup_logging

__all__ = ["setup_logging"]
