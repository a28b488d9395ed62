"""Runs a real model server charged to its shared fake GPU's memory ledger, as the fake
model server charges itself (e2e/fake_model/gpu_ledger.py): the llama-server image's
`/app/llama-server` on kind, when the fake device plugin's shared mode gave the container
`MODELPOOL_GPU_MEMORY`.

    python3 -m e2e.llama.charged BINARY [ARGS...]

With `MODELPOOL_GPU_MEMORY`, `MODELPOOL_GPU_LOCK_DIR` and `NVIDIA_VISIBLE_DEVICES` set, it
charges `MODELPOOL_GPU_FOOTPRINT` bytes to each device's ledger and then becomes BINARY
(exec), whose process keeps the charge's lock until it exits; a load that would pass the
memory exits 3 with `GPU <id> out of memory: ...` before BINARY starts, as a runtime that
cannot allocate its weights fails. Without them it execs BINARY at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e.fake_model.gpu_ledger import GpuLedger, GpuMemoryExhausted

EXIT_BAD_SETTINGS, EXIT_GPU_FULL = 2, 3
NO_DEVICES = frozenset({"", "void", "none"})


class ChargeError(ValueError):
    pass


def ledger_of(env: Mapping[str, str]) -> GpuLedger | None:
    """The charge the environment asks for; None on an exclusive or absent device."""
    memory = env.get("MODELPOOL_GPU_MEMORY", "").strip()
    lock_dir = env.get("MODELPOOL_GPU_LOCK_DIR", "").strip()
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if not memory or not lock_dir or visible.lower() in NO_DEVICES:
        return None
    footprint = env.get("MODELPOOL_GPU_FOOTPRINT", "").strip()
    if not footprint.isdigit() or not memory.isdigit():
        raise ChargeError("a shared GPU needs MODELPOOL_GPU_FOOTPRINT and MODELPOOL_GPU_MEMORY "
                          f"in bytes, got {footprint!r} and {memory!r}")
    devices = tuple(d.strip() for d in visible.split(",") if d.strip())
    return GpuLedger(Path(lock_dir), devices, int(footprint), int(memory))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python3 -m e2e.llama.charged BINARY [ARGS...]", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        ledger = ledger_of(os.environ)
        if ledger is not None:
            for fd in ledger.acquire_for_exec():
                os.set_inheritable(fd, True)  # BINARY holds the charge until it exits
    except ChargeError as e:
        print(f"charged: {e}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except GpuMemoryExhausted as e:
        print(f"charged: {e}", file=sys.stderr)
        return EXIT_GPU_FULL
    os.execv(args[0], args)


if __name__ == "__main__":
    sys.exit(main())
