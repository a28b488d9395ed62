"""How to tell a member is idle, and what its answers mean: the pure half of the probe.

Which endpoint to ask follows from the runtime and `spec.idle` (llama.cpp: `/slots`;
vLLM: `vllm:num_requests_running` on `/metrics`; generic: a path answering 2xx when idle,
or a metric at or below a threshold). A generic member with no idle setting can never be
probed: that is permanent (`UNSUPPORTED`), not a probe that failed this time. Reading the
answers and combining one verdict per pod into one per member also lives here, so
`reconciler.probes` only moves bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reconciler.spec import IdleSpec
from reconciler.swap import Verdict

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_SERVED = "vllm:request_success_total"


class IdleParseError(ValueError):
    """An idle endpoint answered something that is not what its runtime serves."""


class Method(StrEnum):
    SLOTS = "slots"  # llama.cpp: busy while any slot is processing
    METRIC = "metric"  # a Prometheus gauge at or below a threshold is idle
    PATH = "path"  # a path answering 2xx is idle
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class IdleCheck:
    method: Method
    path: str = ""
    metric: str = ""
    threshold: float = 0.0
    # A counter the runtime raises with every request it finishes, read by
    # idleUnloadAfter beside the idle verdict ("" where none is known).
    served_metric: str = ""


def idle_check(runtime: str, idle: IdleSpec | None) -> IdleCheck:
    """The check for a member: an explicit `spec.idle` wins over the runtime's own."""
    if idle is not None and idle.metric:
        return IdleCheck(Method.METRIC, idle.path or "/metrics", idle.metric, idle.threshold)
    if idle is not None and idle.path:
        return IdleCheck(Method.PATH, idle.path)
    if runtime == "llamacpp":
        return IdleCheck(Method.SLOTS, "/slots")
    if runtime == "vllm":
        return IdleCheck(Method.METRIC, "/metrics", VLLM_RUNNING, 0.0, VLLM_SERVED)
    return IdleCheck(Method.UNSUPPORTED)


def slots_mark(body: Any) -> str:
    """What changes in llama.cpp's `/slots` whenever it serves a generation: each slot
    shows the id of its last task (one counter for the server), none before its first;
    reading `/slots`, `/health` or `/v1/models` is no task (docs/llama-cpp.md)."""
    if not isinstance(body, list):
        raise IdleParseError("/slots did not answer a list")
    tasks = [(slot.get("id"), slot.get("id_task")) for slot in body if isinstance(slot, dict)]
    return ",".join(f"{slot}:{task}" for slot, task in tasks)


def served_mark(text: str, check: IdleCheck) -> str:
    """The served counter of a metrics page as a mark ("" when the check reads none, or
    the page lacks it: then only busy readings count as activity)."""
    if not check.served_metric:
        return ""
    try:
        return f"{metric_value(text, check.served_metric):g}"
    except IdleParseError:
        return ""


def slots_busy(body: Any) -> bool:
    """llama.cpp's `/slots`: a list of slots, busy when any `is_processing` is true."""
    if not isinstance(body, list):
        raise IdleParseError("/slots did not answer a list")
    for slot in body:
        if not isinstance(slot, dict) or "is_processing" not in slot:
            raise IdleParseError("/slots answered a slot without is_processing")
        if slot["is_processing"] is True:
            return True
    return False


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)


def metric_value(text: str, name: str) -> float:
    """The sum of a metric's samples over all label sets in Prometheus text format."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group("name") != name:
            continue
        try:
            value = float(match.group("value"))
        except ValueError as e:
            raise IdleParseError(f"{name} has a value that is not a number") from e
        if math.isnan(value):
            raise IdleParseError(f"{name} is NaN")
        total += value
        found = True
    if not found:
        raise IdleParseError(f"{name} is not among the metrics")
    return total


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """One verdict for a member from one per pod. Busy anywhere is busy; a pod that
    could not answer fails the whole check closed; no pods at all is idle."""
    if Verdict.UNSUPPORTED in verdicts:
        return Verdict.UNSUPPORTED
    if Verdict.BUSY in verdicts:
        return Verdict.BUSY
    if Verdict.FAILED in verdicts:
        return Verdict.FAILED
    return Verdict.IDLE
