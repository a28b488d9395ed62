"""The idle probe's HTTP half: with `kv_slots_io` (a member's slots saved and restored),
one of the two reconciler modules that call model servers.

Probes go to each pod's own address (its pod IP and the member's port), never through the
Service: a Service would answer for one pod picked at random, and a busy pod behind it
could be missed. Any error or timeout is a FAILED verdict, so the swap fails closed and the
incumbent stays; what the answers mean is decided in `reconciler.idle`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from reconciler.idle import (
    IdleCheck,
    IdleParseError,
    Method,
    combine,
    metric_value,
    served_mark,
    slots_busy,
    slots_mark,
)
from reconciler.swap import Verdict

log = logging.getLogger(__name__)

Address = tuple[str, int]


UNSUPPORTED_DETAIL = "the generic runtime needs spec.idle (a path or a metric)"


@dataclass(frozen=True)
class Reading:
    """A probe's answer: the verdict, a detail for people, and the activity mark."""

    verdict: Verdict
    detail: str = ""
    mark: str = ""


class IdleProbe(Protocol):
    async def probe(self, check: IdleCheck, addresses: Sequence[Address]) -> tuple[Verdict, str]:
        """One verdict for a member from all its pods, and a detail for people."""
        ...

    async def activity(self, check: IdleCheck, addresses: Sequence[Address]) -> Reading:
        """The verdict, its detail, and a mark that changes whenever the member served."""
        ...


class HttpIdleProbe:
    def __init__(self, session: aiohttp.ClientSession, timeout: float = 3.0) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def probe(self, check: IdleCheck, addresses: Sequence[Address]) -> tuple[Verdict, str]:
        reading = await self.activity(check, addresses)
        return reading.verdict, reading.detail

    async def activity(self, check: IdleCheck, addresses: Sequence[Address]) -> Reading:
        """The idle verdict as `probe` gives it, with a mark of all pods that changes
        whenever one of them served a request (idleUnloadAfter)."""
        if check.method is Method.UNSUPPORTED:
            return Reading(Verdict.UNSUPPORTED, UNSUPPORTED_DETAIL)
        ordered = sorted(addresses)
        results = await asyncio.gather(*(self._one(check, a) for a in ordered))
        verdict = combine([r.verdict for r in results])
        details = "; ".join(r.detail for r in results if r.verdict is verdict and r.detail)
        marks = [f"{host}:{port}={r.mark}" for (host, port), r in zip(ordered, results,
                                                                      strict=True) if r.mark]
        return Reading(verdict, details, " ".join(marks))

    async def _one(self, check: IdleCheck, address: Address) -> Reading:
        reading = await self._read(check, address)
        if check.method is Method.SLOTS and reading.verdict is Verdict.IDLE:
            # llama.cpp frees a slot and only then hands it the request that waited in its
            # queue, which `/slots` does not list; a reading taken between the two is idle
            # with a request still to serve (seen on a loaded host). One more reading,
            # sent once the first is answered, comes after the hand-off.
            reading = await self._read(check, address)
        return reading

    async def _read(self, check: IdleCheck, address: Address) -> Reading:
        host, port = address
        url = f"http://{host}:{port}{check.path}"
        try:
            async with self._session.get(url, timeout=self._timeout) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.info("idle probe %s failed: %s", url, e)
            return Reading(Verdict.FAILED, f"{url}: {type(e).__name__}")
        if check.method is Method.PATH:
            if 200 <= status < 300:
                return Reading(Verdict.IDLE)
            return Reading(Verdict.BUSY, f"{url} answered {status}")
        if status != 200:
            return Reading(Verdict.FAILED, f"{url} answered {status}")
        try:
            if check.method is Method.SLOTS:
                slots = json.loads(body)
                mark = slots_mark(slots)
                if slots_busy(slots):
                    return Reading(Verdict.BUSY, f"{url}: a slot is processing", mark)
                return Reading(Verdict.IDLE, "", mark)
            text = body.decode("utf-8", "replace")
            value = metric_value(text, check.metric)
        except (IdleParseError, ValueError) as e:
            return Reading(Verdict.FAILED, f"{url}: {str(e)[:200]}")
        except RecursionError:
            return Reading(Verdict.FAILED, f"{url}: the answer nests too deeply to read")
        mark = served_mark(text, check)
        if value <= check.threshold:
            return Reading(Verdict.IDLE, "", mark)
        return Reading(Verdict.BUSY, f"{url}: {check.metric} is {value:g}", mark)
