"""Leader election on a coordination Lease, so two reconciler replicas are safe.

Only the leader reconciles; the others keep their caches warm and wait. Like client-go,
a candidate does not compare its clock with the holder's: it takes the Lease over only
when the record has not changed for a whole lease duration by its own clock. Every write
is a PUT carrying the resourceVersion it read, so two candidates cannot both win. A leader
that cannot renew in time stops leading (the process exits and restarts as a candidate);
on a graceful shutdown it gives the Lease up so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from reconciler.kube import LEASES, Conflict, Kube, KubeError
from reconciler.settings import LeaderSettings
from reconciler.timefmt import rfc3339_micro

log = logging.getLogger(__name__)


class LeadershipLost(Exception):
    """The Lease could not be renewed in time; stop reconciling."""


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        settings: LeaderSettings,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._s = settings
        self._clock = clock
        self._monotonic = monotonic
        self._observed_record: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.leading = False

    def _lease_body(self, old: dict[str, Any] | None) -> dict[str, Any]:
        now = rfc3339_micro(self._clock())
        spec = dict((old or {}).get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
        if spec.get("holderIdentity") != self._s.identity:
            spec["acquireTime"] = now
            if old is not None:
                transitions += 1
        spec.update(
            holderIdentity=self._s.identity,
            leaseDurationSeconds=int(self._s.lease_seconds),
            renewTime=now,
            leaseTransitions=transitions,
        )
        meta: dict[str, Any] = {"name": self._s.name, "namespace": self._s.namespace}
        if old is not None:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        lease = await self._kube.get(LEASES, self._s.namespace, self._s.name)
        try:
            if lease is None:
                await self._kube.create(LEASES, self._s.namespace, self._lease_body(None))
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
            if record != self._observed_record:
                self._observed_record = record
                self._observed_at = self._monotonic()
            duration = float(spec.get("leaseDurationSeconds") or self._s.lease_seconds)
            expired = self._monotonic() - self._observed_at > duration
            if holder and holder != self._s.identity and not expired:
                return False
            await self._kube.replace(LEASES, self._s.namespace, self._s.name,
                                     self._lease_body(lease))
            return True
        except Conflict:
            return False  # someone else wrote it first

    async def acquire(self) -> None:
        """Wait until this replica leads."""
        log.info("waiting to lead (Lease %s/%s as %s)", self._s.namespace, self._s.name,
                 self._s.identity)
        while True:
            try:
                if await self.try_acquire_or_renew():
                    self.leading = True
                    log.info("leading as %s", self._s.identity)
                    return
            except KubeError as e:
                log.warning("leader election: %s", e)
            await asyncio.sleep(self._s.retry_seconds)

    async def hold(self) -> None:
        """Renew until leadership is lost (raises LeadershipLost); runs until cancelled."""
        last_renewed = self._monotonic()
        while True:
            await asyncio.sleep(self._s.renew_seconds)
            try:
                if await self.try_acquire_or_renew():
                    last_renewed = self._monotonic()
                    continue
                raise LeadershipLost("another replica holds the Lease")
            except KubeError as e:
                log.warning("could not renew the Lease: %s", e)
            if self._monotonic() - last_renewed > self._s.lease_seconds:
                self.leading = False
                raise LeadershipLost("the Lease was not renewed within its duration")

    async def release(self) -> None:
        """Give the Lease up (graceful shutdown), so a standby need not wait it out."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self._kube.get(LEASES, self._s.namespace, self._s.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self._s.identity:
                return
            body = self._lease_body(lease)
            body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            await self._kube.replace(LEASES, self._s.namespace, self._s.name, body)
            log.info("released the Lease")
        except KubeError as e:
            log.warning("could not release the Lease: %s", e)
