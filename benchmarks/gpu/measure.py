"""The GPU script's measurements (benchmarks/gpu/run.sh calls this; docs/benchmarks-log.md,
"The GPU script", says what each measures): the models written, then each step of
steps.py in turn on one llama-server binary, a step that fails recorded in the results and
the next one run. Every figure goes to `results.json` (rewritten after each step, so a run
cut short keeps what it measured) and the table to `table.md`, both in the output folder.

    python -m benchmarks.gpu.measure models --profile gpu --work DIR
    python -m benchmarks.gpu.measure run --profile gpu --binary BIN --work DIR --out DIR
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.gpu import model_files, table
from benchmarks.gpu.memory import NvidiaSmi, Probe, ProcRss
from benchmarks.gpu.profiles import PROFILES, Profile
from benchmarks.gpu.server import ServerError
from benchmarks.gpu.steps import STEPS, Run, now


def write_models(profile: Profile, work: Path) -> dict[str, Path]:
    return {size: model_files.write(work / "models", size) for size in profile.sizes}


def run_all(profile: Profile, binary: Path, work: Path, out: Path,
            build_s: float | None, steps: list[str]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    probe: Probe = NvidiaSmi() if profile.nvidia else ProcRss()
    with (out / "servers.log").open("ab") as log:
        run = Run(profile, binary, work, out, probe, log)
        run.results.update({
            "profile": profile.name, "started": now(), "finished": None,
            "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                     "root": os.geteuid() == 0},
            "device": probe.describe(), "binary": str(binary), "build_s": build_s,
            "profile_settings": asdict(profile), "models": [],
            "load": [], "swap": [], "resident": [], "kv": [], "errors": []})
        start = time.monotonic()
        run.paths = write_models(profile, work)
        run.results["models_s"] = time.monotonic() - start
        for size, path in run.paths.items():
            run.results["models"].append({"size": size, "path": str(path),
                                          "bytes": path.stat().st_size,
                                          **asdict(model_files.shape(path))})
        run.save()
        for name in steps:
            start = time.monotonic()
            try:
                STEPS[name](run)
            except (ServerError, OSError, subprocess.SubprocessError, KeyError, TypeError,
                    ValueError) as error:
                run.results["errors"].append({"step": name, "error": repr(error),
                                              "trace": traceback.format_exc(limit=3)})
                print(f"[gpu bench] {name} failed: {error!r}", file=sys.stderr)
            run.results.setdefault("step_s", {})[name] = time.monotonic() - start
            run.save()
            print(f"[gpu bench] {name} done in {time.monotonic() - start:.1f}s",
                  file=sys.stderr)
        return run.results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.measure",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("models", "run"))
    parser.add_argument("--profile", choices=sorted(PROFILES), required=True)
    parser.add_argument("--work", type=Path, required=True, help="models and slot files")
    parser.add_argument("--binary", type=Path, help="llama-server (run)")
    parser.add_argument("--out", type=Path, help="results.json, table.md, servers.log (run)")
    parser.add_argument("--build-seconds", type=float, default=None)
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated, of {','.join(STEPS)}")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.command == "models":
        for path in write_models(profile, args.work).values():
            print(path)
        return 0
    if args.binary is None or args.out is None:
        parser.error("run needs --binary and --out")
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps: {unknown}")
    results = run_all(profile, args.binary, args.work, args.out, args.build_seconds, steps)
    print(table.render(results))
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
