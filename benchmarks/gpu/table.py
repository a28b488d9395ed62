"""The GPU script's results (measure.py's `results.json`) as one markdown table: a row per
figure, a line above it naming the machine. Pure; also re-renders a saved run:

    python -m benchmarks.gpu.table results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} MiB"


def share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def machine(results: dict[str, Any]) -> str:
    device = results.get("device", {})
    host = results.get("host", {})
    if device.get("probe") == "nvidia-smi":
        where = (f"{device.get('name')} ({device.get('total_mib', 0):,} MiB, driver "
                 f"{device.get('driver')}, compute capability {device.get('compute_cap')})")
    else:
        where = f"CPUs only ({host.get('cpus')} cores), memory from /proc RSS"
    build = results.get("build_s")
    built = "" if build is None else f", llama-server built in {build:.0f} s"
    return f"Profile `{results.get('profile')}` on {where}, {results.get('started')}{built}."


def load_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for r in results.get("load", []):
        cache = r["cache"]
        if cache == "cold":
            cache = f"cold ({r['cold_method']}; {share(r['cached_before'])} cached before)"
        rows.append(("load to /health 200", f"{r['model']} ({r['bytes'] / 1e9:.2f} GB), "
                     f"{cache}", seconds(r["ready_s"])))
    return rows


def swap_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [("swap", f"{r['from']} → {r['to']}",
             f"{seconds(r['total_s'])} (exit {seconds(r['exit_s'])}, memory freed "
             f"{seconds(r['freed_s'])} later, ready {seconds(r['ready_s'])}; "
             f"{'answered' if r['answered'] else 'NOT answered'})")
            for r in results.get("swap", [])]


def resident_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for r in results.get("resident", []):
        for m in r["members"]:
            measured, declared = m["measured_mib"], m["declared_mib"]
            over = "" if measured is None else f", {measured - declared:+,.0f} MiB over"
            rows.append((f"{r['count']} resident", m["model"],
                         f"measured {mib(measured)}, declared {mib(declared)} (file "
                         f"{mib(m['file_mib'])} + KV {mib(m['kv_mib'])} at {m['context']:,} "
                         f"tokens){over}; {'answered' if m['answered'] else 'NOT answered'} "
                         f"in {seconds(m['answer_s'])}"))
        if r.get("card_used_mib") is not None:
            used = r["card_used_mib"] - (r.get("card_baseline_mib") or 0)
            declared = sum(m["declared_mib"] for m in r["members"])
            rows.append((f"{r['count']} resident", "the card, all of them",
                         f"used {mib(used)} over idle, declared {mib(declared)}"))
    return rows


def kv_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [("KV restore vs re-prefill", f"{r['model']}, {r['context']:,} tokens",
             f"restore {seconds(r['restore_s'])} + continue {seconds(r['continue_s'])} "
             f"(n_restored {r['n_restored']:,}, cache_n {r['continue_cache_n']:,}, prompt_n "
             f"{r['continue_prompt_n']:,}) vs re-prefill {seconds(r['reprefill_s'])} "
             f"(prompt_n {r['reprefill_prompt_n']:,}); save {seconds(r['save_s'])}, "
             f"{mib(r['file_bytes'] / 2**20)} file")
            for r in results.get("kv", [])]


def render(results: dict[str, Any]) -> str:
    rows = (load_rows(results) + swap_rows(results) + resident_rows(results)
            + kv_rows(results))
    rows += [("error", e["step"], e["error"]) for e in results.get("errors", [])]
    lines = [machine(results), "", "| step | case | figure |", "| --- | --- | --- |"]
    lines += [f"| {step} | {case} | {figure.replace('|', '/')} |" for step, case, figure in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.gpu.table results.json", file=sys.stderr)
        return 2
    print(render(json.loads(Path(args[0]).read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
