"""Removing the slot files no manifest names, through a persisted member's kv-files
container (`reconciler.kv_files`, the one writer on the claim besides llama-server):

- after a restore, the member's own files: its manifest is consumed (or discarded), so
  nothing will trust them again (`after_restore`);
- while members run, the files of every owner that is no ModelServer on that claim any
  more: a member deleted from git on a claim it shared (`sync`, once per pod and per set
  of owners; a deletion wakes the namespace's persisted members, `server_gone`).

Which owners stay is `keep`: every ModelServer of the namespace (`{name}-{uid8}`) but
those whose spec says their slots go to another claim or nowhere; a spec that cannot be
read keeps its owner. A prune that cannot be made (the container not up yet) is tried
again after a backoff; what it removed and what it could not are logged.

A restore's removal of the member's own files stays owed until a prune through one of its
pods is made (the container may not listen yet when the restore ends): every prune of that
member leaves its own owner out while it is owed. A save rewrites the same file names, so
it cancels what is owed, and a prune that leaves the member's owner out never runs while
its save does (`saving`, one lock per member): the files of a newer save are never removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from reconciler import kv_cache
from reconciler.context import Context
from reconciler.kv_slots_io import Address, PruneReport
from reconciler.logs import ObjectLogger
from reconciler.objects import meta, pod_ready
from reconciler.render import KV_FILES, kv_claim_name
from reconciler.spec import ModelServerSpec, SpecError
from reconciler.stores import SERVER

log = logging.getLogger(__name__)

RETRY_SECONDS = (2.0, 5.0, 15.0, 60.0, 300.0)


def files_address(pod: Mapping[str, Any]) -> Address | None:
    """The address of a Ready pod's kv-files container (None: it has none, or the pod is
    not Ready: the container then may not listen yet)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not pod_ready(pod) or meta(pod).get("deletionTimestamp"):
        return None
    for container in (pod.get("spec") or {}).get("containers") or ():
        if container.get("name") != KV_FILES:
            continue
        for port in container.get("ports") or ():
            if port.get("name") == KV_FILES and isinstance(port.get("containerPort"), int):
                return str(ip), int(port["containerPort"])
    return None


class KvPrune:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # Per (namespace, member): the owners each of its pods was last pruned with.
        self._done: dict[tuple[str, str], dict[str, frozenset[str]]] = {}
        self._failures: dict[str, int] = {}  # by pod UID
        self._retrying: set[str] = set()  # pod UIDs with a retry waiting
        # Members (namespace, name) whose own files a restore left to remove.
        self._owed: set[tuple[str, str]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._saving: set[tuple[str, str]] = set()  # members whose save runs

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((namespace, name), asyncio.Lock())

    @contextlib.asynccontextmanager
    async def saving(self, namespace: str, name: str) -> AsyncIterator[None]:
        """Held while `name` saves its slots: no prune of its own files runs meanwhile,
        and what a restore owed is cancelled (the save writes those names anew)."""
        async with self._lock(namespace, name):
            self._owed.discard((namespace, name))
            self._saving.add((namespace, name))
            try:
                yield
            finally:
                self._saving.discard((namespace, name))

    def owed(self, namespace: str, name: str) -> bool:
        """A restore's removal of `name`'s own files has not been made yet."""
        return (namespace, name) in self._owed

    def _keep_for(self, spec: ModelServerSpec, claim: str) -> frozenset[str]:
        keep = self.keep(spec.namespace, claim)
        if self.owed(spec.namespace, spec.name) and spec.uid is not None:
            keep -= {kv_cache.owner(spec.name, spec.uid)}
        return keep

    def keep(self, namespace: str, claim: str) -> frozenset[str]:
        """The owners whose files stay on `claim`."""
        owners = set()
        for body in self.ctx.stores.servers.items(namespace):
            m = meta(body)
            name, uid = m.get("name"), m.get("uid")
            if not isinstance(name, str) or not isinstance(uid, str):
                continue
            try:
                if kv_claim_name(ModelServerSpec.from_body(body)) != claim:
                    continue
            except SpecError:
                pass  # unreadable: its files stay
            owners.add(kv_cache.owner(name, uid))
        return frozenset(owners)

    def sync(self, spec: ModelServerSpec, pods: Sequence[Mapping[str, Any]],
             logger: ObjectLogger) -> None:
        """Prune through each running pod of the persisted member `spec` whose last prune
        kept other owners than those that exist now."""
        claim = kv_claim_name(spec)
        if claim is None or self.ctx.slot_files is None:
            return
        keep = self._keep_for(spec, claim)
        before = self._done.get((spec.namespace, spec.name), {})
        now: dict[str, frozenset[str]] = {}
        for pod in pods:
            uid = meta(pod).get("uid")
            address = files_address(pod)
            if not isinstance(uid, str) or address is None:
                continue
            now[uid] = keep
            if before.get(uid) != keep:
                self.ctx.background.start(self._prune(spec, uid, address, keep, logger),
                                          f"kv-prune-{spec.name}")
        for gone in before.keys() - now.keys():
            self._failures.pop(gone, None)
        self._done[(spec.namespace, spec.name)] = now

    async def after_restore(self, spec: ModelServerSpec, pod_uid: str,
                            address: Address | None, logger: ObjectLogger) -> None:
        """Remove `spec`'s own files (its manifest is consumed) and every other file no
        ModelServer on the claim owns: owed until made, through its pod `pod_uid` at
        `address` now (asked again after a backoff), or through its pod once it is Ready
        (`address` None: the pod's container may not listen yet)."""
        claim = kv_claim_name(spec)
        if claim is None or self.ctx.slot_files is None or spec.uid is None:
            return
        if (spec.namespace, spec.name) in self._saving:
            return  # a save already writes its files anew: nothing of them is owed
        self._owed.add((spec.namespace, spec.name))
        self._done.get((spec.namespace, spec.name), {}).pop(pod_uid, None)
        if address is not None:
            await self._prune(spec, pod_uid, address, self._keep_for(spec, claim), logger)

    def server_gone(self, namespace: str, name: str) -> None:
        """A ModelServer was deleted: its files go from the claims of the members that run."""
        self._done.pop((namespace, name), None)
        self._owed.discard((namespace, name))
        lock = self._locks.get((namespace, name))
        if lock is not None and not lock.locked():
            del self._locks[(namespace, name)]
        for body in self.ctx.stores.servers.items(namespace):
            try:
                spec = ModelServerSpec.from_body(body)
            except SpecError:
                continue
            if kv_claim_name(spec) is not None:
                self.ctx.add(SERVER, namespace, spec.name)

    async def _prune(self, spec: ModelServerSpec, pod_uid: str, address: Address,
                     keep: frozenset[str], logger: ObjectLogger) -> None:
        assert self.ctx.slot_files is not None
        member = (spec.namespace, spec.name)
        async with self._lock(*member):
            own = kv_cache.owner(spec.name, spec.uid) if spec.uid is not None else None
            if (own is not None and own not in keep and not self.owed(*member)
                    and own in self.keep(spec.namespace, kv_claim_name(spec) or "")):
                # Asked to remove the member's own files, but a save since has written
                # them anew: they stay.
                keep = keep | {own}
            report = await self.ctx.slot_files.prune(address, keep)
            if report.error is None and (own is None or own not in keep):
                self._owed.discard(member)
        _log(logger, report)
        if report.error is None:
            self._failures.pop(pod_uid, None)
            return
        # Not asked: forget it, so the member's reconcile after the backoff asks again.
        done = self._done.get((spec.namespace, spec.name), {})
        done.pop(pod_uid, None)
        failures = self._failures.get(pod_uid, 0)
        self._failures[pod_uid] = failures + 1
        if pod_uid in self._retrying:
            return  # one retry waits already
        self._retrying.add(pod_uid)
        try:
            await asyncio.sleep(RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)])
        finally:
            self._retrying.discard(pod_uid)
        self.ctx.add(SERVER, spec.namespace, spec.name)


def _log(logger: ObjectLogger, report: PruneReport) -> None:
    if report.error is not None:
        logger.info("slot files on the claim not pruned: %s", report.error)
    if report.removed:
        logger.info("removed %d slot files no manifest names: %s", len(report.removed),
                    ", ".join(report.removed))
    for file, why in report.failed:
        logger.warning("slot file %s not removed: %s", file, why)
