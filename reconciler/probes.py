"""The idle probe's HTTP half: the one module of the reconciler that calls model servers.

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
from typing import Protocol

import aiohttp

from reconciler.idle import IdleCheck, IdleParseError, Method, combine, metric_value, slots_busy
from reconciler.swap import Verdict

log = logging.getLogger(__name__)

Address = tuple[str, int]


class IdleProbe(Protocol):
    async def probe(self, check: IdleCheck, addresses: Sequence[Address]) -> tuple[Verdict, str]:
        """One verdict for a member from all its pods, and a detail for people."""
        ...


class HttpIdleProbe:
    def __init__(self, session: aiohttp.ClientSession, timeout: float = 3.0) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def probe(self, check: IdleCheck, addresses: Sequence[Address]) -> tuple[Verdict, str]:
        if check.method is Method.UNSUPPORTED:
            return Verdict.UNSUPPORTED, "the generic runtime needs spec.idle (a path or a metric)"
        results = await asyncio.gather(*(self._one(check, a) for a in addresses))
        verdict = combine([v for v, _ in results])
        details = "; ".join(d for v, d in results if v is verdict and d)
        return verdict, details

    async def _one(self, check: IdleCheck, address: Address) -> tuple[Verdict, str]:
        host, port = address
        url = f"http://{host}:{port}{check.path}"
        try:
            async with self._session.get(url, timeout=self._timeout) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.info("idle probe %s failed: %s", url, e)
            return Verdict.FAILED, f"{url}: {type(e).__name__}"
        if check.method is Method.PATH:
            if 200 <= status < 300:
                return Verdict.IDLE, ""
            return Verdict.BUSY, f"{url} answered {status}"
        if status != 200:
            return Verdict.FAILED, f"{url} answered {status}"
        try:
            if check.method is Method.SLOTS:
                busy = slots_busy(json.loads(body))
                return (Verdict.BUSY, f"{url}: a slot is processing") if busy else (
                    Verdict.IDLE, "")
            value = metric_value(body.decode("utf-8", "replace"), check.metric)
        except (IdleParseError, ValueError) as e:
            return Verdict.FAILED, f"{url}: {str(e)[:200]}"
        if value <= check.threshold:
            return Verdict.IDLE, ""
        return Verdict.BUSY, f"{url}: {check.metric} is {value:g}"
