"""The GPU script's steps, each on a `Run` (the binary, the models, the memory probe and
the results so far), each appending its figures to the results and saving them:

- load: exec to the first `/health` 200 of each model, page cache cold, then warm;
- swap: as modelpool performs one (SIGTERM to the incumbent, its exit, its memory free
  again, the target started and ready), smallest to middle to largest and back;
- resident: the two smaller, then all three servers at once, each answering, each
  process's memory against the footprint a pool member would declare (footprint.py);
- kv: a prompt of each length prefilled in slot 0, saved, the slot erased and restored,
  the prompt continued from the restored cache, against the same request re-prefilled.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from benchmarks.gpu import model_files, page_cache, table
from benchmarks.gpu.footprint import MIB, footprint_bytes, kv_cache_bytes
from benchmarks.gpu.memory import Probe
from benchmarks.gpu.profiles import Profile
from benchmarks.gpu.server import POLL_S, LlamaServer, ServerError
from e2e.llama import models

FREED_SLACK_MIB = 256  # the card's used memory within this of its level before: freed
FREED_TIMEOUT_S = 120
CONTINUATION = 16  # tokens added to a restored prompt, as the next turn of a conversation


def prompt_tokens(count: int, offset: int = 0) -> list[int]:
    """`count` token ids of the generated vocabulary's ordinary pieces, deterministic."""
    _, _, types = models.vocabulary()
    pieces = [i for i, t in enumerate(types) if t == models.NORMAL]
    return [pieces[(offset + i * 7) % len(pieces)] for i in range(count)]


@dataclass
class Run:
    """One run of the steps: what they start servers with and where the figures go."""

    profile: Profile
    binary: Path
    work: Path
    out: Path
    probe: Probe
    log: BinaryIO
    results: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)

    def server(self, size: str, context: int, *extra: str) -> LlamaServer:
        self.log.write(f"\n===== {size}, context {context}\n".encode())
        self.log.flush()
        return LlamaServer(self.binary, self.paths[size], context,
                           [*self.profile.server_args, *extra], self.log, size)

    def warm_models(self) -> None:
        """Every model back in the page cache (a cold load's drop_caches takes the others'
        pages too): the steps after the loads measure warm swaps."""
        start = time.monotonic()
        for path in self.paths.values():
            page_cache.ensure_cached(path)
        self.results.setdefault("rewarm_s", []).append(time.monotonic() - start)

    def baseline(self) -> float | None:
        return self.probe.used_mib()

    def wait_freed(self, pid: int, baseline: float | None) -> float:
        """Seconds until the exited process holds no memory the probe sees, and the card's
        used memory is back within FREED_SLACK_MIB of `baseline`. Each reading is one
        nvidia-smi call (tens of milliseconds), which bounds the figure's resolution: the
        mean time between readings goes to the results (`freed_reading_interval_s`)."""
        start = time.monotonic()
        readings = 0

        def freed() -> bool:
            nonlocal readings
            readings += 1
            if self.probe.listed(pid):
                return False
            readings += 1
            used = self.probe.used_mib()
            return baseline is None or used is None or used <= baseline + FREED_SLACK_MIB

        while not freed():
            if time.monotonic() - start > FREED_TIMEOUT_S:
                raise ServerError(f"the memory of process {pid} was not freed in "
                                  f"{FREED_TIMEOUT_S} s")
            time.sleep(POLL_S)
        elapsed = time.monotonic() - start
        self.results.setdefault("freed_reading_interval_s", []).append(elapsed / readings)
        return elapsed

    def stop(self, server: LlamaServer, baseline: float | None) -> tuple[float, float]:
        """Seconds to exit, then seconds until its memory is free."""
        exit_s = server.stop()
        return exit_s, self.wait_freed(server.pid, baseline)

    def save(self) -> None:
        self.results["finished"] = now()
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2) + "\n")
        (self.out / "table.md").write_text(table.render(self.results))


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextlib.contextmanager
def servers_stopped(run: Run, baseline: float | None) -> Iterator[list[LlamaServer]]:
    """The servers a step starts, stopped (and their memory free) however it ends: all of
    them first, since the card's memory returns to `baseline` only once the last is gone."""
    started: list[LlamaServer] = []
    try:
        yield started
    finally:
        for server in started:
            with contextlib.suppress(ServerError):
                server.stop()
        for server in started:
            with contextlib.suppress(ServerError):
                run.wait_freed(server.pid, baseline)


def load_step(run: Run) -> None:
    context = run.profile.load_context
    for size in run.profile.sizes:
        path = run.paths[size]
        for cache in ("cold", "warm"):
            baseline = run.baseline()
            method = page_cache.evict(path, run.profile.drop_all) if cache == "cold" else "-"
            cached = page_cache.cached_fraction(path)
            with servers_stopped(run, baseline) as started:
                started.append(server := run.server(size, context))
                ready_s = server.wait_ready(run.profile.ready_timeout_s)
            run.results["load"].append({
                "model": size, "bytes": path.stat().st_size, "cache": cache,
                "cold_method": method, "cached_before": cached, "ready_s": ready_s})
            run.save()


def swap_step(run: Run) -> None:
    run.warm_models()
    sizes = run.profile.sizes
    context = run.profile.load_context
    baseline = run.baseline()
    with servers_stopped(run, baseline) as started:
        started.append(incumbent := run.server(sizes[0], context))
        incumbent.wait_ready(run.profile.ready_timeout_s)
        for target in (sizes[1], sizes[2], sizes[0]):
            start = time.monotonic()
            exit_s, freed_s = run.stop(incumbent, baseline)
            started.append(server := run.server(target, context))
            ready_s = server.wait_ready(run.profile.ready_timeout_s)
            total_s = time.monotonic() - start
            answer = server.complete(prompt_tokens(8), 4)
            run.results["swap"].append({
                "from": incumbent.label, "to": target, "exit_s": exit_s,
                "freed_s": freed_s, "ready_s": ready_s, "total_s": total_s,
                "answered": answer.get("tokens_predicted", 0) > 0})
            run.save()
            incumbent = server


def resident_step(run: Run) -> None:
    run.warm_models()
    context = run.profile.load_context
    baseline = run.baseline()
    with servers_stopped(run, baseline) as started:
        for count in (2, 3):
            new = [run.server(size, context) for size in run.profile.sizes[len(started):count]]
            started.extend(new)
            for server in new:
                server.wait_ready(run.profile.ready_timeout_s)
            members = []
            for server in started:
                start = time.monotonic()
                answer = server.complete(prompt_tokens(8, offset=server.pid), 4)
                answer_s = time.monotonic() - start
                file_bytes = server.model.stat().st_size
                shape = model_files.shape(server.model)
                members.append({
                    "model": server.label, "pid": server.pid, "context": context,
                    "file_mib": file_bytes / MIB,
                    "kv_mib": kv_cache_bytes(shape, context) / MIB,
                    "declared_mib": footprint_bytes(file_bytes, shape, context) / MIB,
                    "measured_mib": run.probe.process_mib(server.pid),
                    "answered": answer.get("tokens_predicted", 0) > 0, "answer_s": answer_s})
            used = run.probe.used_mib()
            run.results["resident"].append({
                "count": count, "members": members,
                "card_used_mib": used, "card_baseline_mib": baseline})
            run.save()


def kv_step(run: Run) -> None:
    profile = run.profile
    run.warm_models()
    slots = run.work / "slots"
    slots.mkdir(parents=True, exist_ok=True)
    baseline = run.baseline()
    with servers_stopped(run, baseline) as started:
        started.append(server := run.server(profile.kv_size, profile.kv_server_context,
                                            "--slot-save-path", str(slots)))
        server.wait_ready(profile.ready_timeout_s)
        for count in profile.kv_contexts:
            prompt = prompt_tokens(count)
            longer = prompt + prompt_tokens(CONTINUATION, offset=count)
            filename = f"context-{count}.bin"
            server.post("/slots/0?action=erase", {})
            start = time.monotonic()
            first = server.complete(prompt, 1)
            prefill_s = time.monotonic() - start
            start = time.monotonic()
            saved = server.post("/slots/0?action=save", {"filename": filename})
            save_s = time.monotonic() - start
            server.post("/slots/0?action=erase", {})
            start = time.monotonic()
            restored = server.post("/slots/0?action=restore", {"filename": filename})
            restore_s = time.monotonic() - start
            start = time.monotonic()
            continued = server.complete(longer, 1)
            continue_s = time.monotonic() - start
            server.post("/slots/0?action=erase", {})
            start = time.monotonic()
            again = server.complete(longer, 1)
            reprefill_s = time.monotonic() - start
            file_bytes = (slots / filename).stat().st_size
            (slots / filename).unlink()
            run.results["kv"].append({
                "context": count, "model": profile.kv_size,
                "prefill_s": prefill_s, "prefill_prompt_n": first["timings"]["prompt_n"],
                "save_s": save_s, "n_saved": saved["n_saved"], "file_bytes": file_bytes,
                "restore_s": restore_s, "n_restored": restored["n_restored"],
                "restore_ms": restored["timings"]["restore_ms"],
                "continue_s": continue_s,
                "continue_cache_n": continued["timings"]["cache_n"],
                "continue_prompt_n": continued["timings"]["prompt_n"],
                "reprefill_s": reprefill_s,
                "reprefill_cache_n": again["timings"]["cache_n"],
                "reprefill_prompt_n": again["timings"]["prompt_n"]})
            run.save()


STEPS: dict[str, Callable[[Run], None]] = {
    "load": load_step, "swap": swap_step, "resident": resident_step, "kv": kv_step}
