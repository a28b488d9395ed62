"""The shell of the `Saving` and `Restoring` phases: a pool machine's `SaveSlots` and
`RestoreSlots` (`reconciler.kv_phases`) run beside the reconcile with
`reconciler.kv_slots_io`, and answered to the machine whatever happened.

A save first removes the member's manifest (`status.kvCache`: the new save rewrites the
same file names), saves within what is left of its deadline and writes the new manifest
once the saves have answered. A save that fails (the server refuses, the disk is full,
it cannot be reached) is logged, counted and told by a Warning Event on the ModelServer;
the unload goes on either way. A restore reads the manifest, restores what matches the new
process and removes the manifest; one made for another process is discarded, with a log
line and an Event naming the member and why. Either way the member's files are then
removed through its pod's kv-files container (`reconciler.kv_prune`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from reconciler import kv_slots_io as io
from reconciler.context import Context
from reconciler.kv_phases import RestoreResult, RestoreSlots, SaveResult, SaveSlots
from reconciler.kv_prune import KvPrune, files_address
from reconciler.logs import ObjectLogger
from reconciler.objects import meta, pod_active
from reconciler.spec import KvCache, ModelServerSpec, SpecError

log = logging.getLogger(__name__)

KV_SAVE_FAILED = "KvSaveFailed"
KV_CACHE_DISCARDED = "KvCacheDiscarded"
KV_CACHE_RESTORED = "KvCacheRestored"
Answer = Callable[[SaveResult | RestoreResult], None]


def saved_members(servers: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The members (by name, of their ModelServer bodies) with a manifest in status."""
    return frozenset(name for name, body in servers.items()
                     if isinstance((body.get("status") or {}).get("kvCache"), dict))


class _Target(NamedTuple):
    """A member being saved or restored: the slot files, its body, spec and kvCache, its
    running pod's address (and its kv-files container's), and a logger that posts Events
    on it."""

    files: io.SlotFiles
    body: Mapping[str, Any]
    spec: ModelServerSpec
    kv: KvCache
    address: io.Address
    logger: ObjectLogger
    prune_at: io.Address | None
    pod_uid: str


class SlotSaves:
    def __init__(self, ctx: Context, prune: KvPrune) -> None:
        self.ctx = ctx
        self.prune = prune

    def save(self, namespace: str, action: SaveSlots, answer: Answer) -> None:
        self.ctx.background.start(self._run(namespace, action, answer), f"save-{action.member}")

    def restore(self, namespace: str, action: RestoreSlots, answer: Answer) -> None:
        self.ctx.background.start(self._run(namespace, action, answer),
                                  f"restore-{action.member}")

    async def _run(self, namespace: str, action: SaveSlots | RestoreSlots,
                   answer: Answer) -> None:
        member = action.member
        try:
            if isinstance(action, SaveSlots):
                await self._save(namespace, action)
            else:
                await self._restore(namespace, action)
        except asyncio.CancelledError:
            raise
        except Exception:  # the machine is answered whatever went wrong
            log.exception("kv %s of %s/%s failed",
                          "save" if isinstance(action, SaveSlots) else "restore",
                          namespace, member)
        finally:
            answer(SaveResult(member) if isinstance(action, SaveSlots)
                   else RestoreResult(member))

    def _target(self, namespace: str, member: str) -> _Target | None:
        """What a save or a restore of `member` works with; None when the reconciler keeps
        no slot files, the member keeps nothing or no pod of it runs."""
        files = self.ctx.slot_files
        body = self.ctx.stores.servers.get(namespace, member)
        if files is None or body is None:
            return None
        try:
            spec = ModelServerSpec.from_body(body)
        except SpecError:
            return None
        kv = spec.kv_cache
        if kv is None or not kv.persist:
            return None
        for pod in self.ctx.lookups.pods_of(namespace, member):
            ip = (pod.get("status") or {}).get("podIP")
            if pod_active(pod) and ip and not meta(pod).get("deletionTimestamp"):
                return _Target(files, body, spec, kv, (str(ip), spec.port),
                               self.ctx.writer.logger(body, log), files_address(pod),
                               str(meta(pod).get("uid") or ""))
        return None

    async def _write(self, namespace: str, member: str, value: dict[str, Any] | None) -> None:
        """status.kvCache of `member` set to `value` (None: removed)."""
        servers = self.ctx.stores.servers
        body = servers.get(namespace, member)
        if body is None or (body.get("status") or {}).get("kvCache") == value:
            return
        await self.ctx.writer.patch_status(servers, body, {"kvCache": value})

    def _event(self, logger: ObjectLogger, type_: str, reason: str, message: str) -> None:
        self.ctx.background.run(functools.partial(logger.event, type_, reason, message),
                                f"event-{reason}")

    async def _save(self, namespace: str, action: SaveSlots) -> None:
        ctx = self.ctx
        target = self._target(namespace, action.member)
        if target is None:
            return
        files, _, spec, kv, address, logger, _, _ = target
        # No prune of the member's own files while it writes them (reconciler.kv_prune).
        async with self.prune.saving(namespace, action.member):
            await self._write(namespace, action.member, None)
            left = max(0.0, min(kv.save_timeout, action.deadline - ctx.clock()))
            report = await files.save(address, spec.name, spec.uid or "", replace(
                kv, save_timeout=left), io.IdentityArgs(spec.model or "", spec.args),
                ctx.clock)
            await self._write(namespace, action.member, io.status_value(report, ctx.clock()))
        count = ctx.metrics.kv_slots_total
        failed = [k for k in report.skipped if k.reason not in ("empty", "time cap",
                                                                 "size cap")]
        cut = [k for k in report.skipped if k.reason == "time cap"]
        if report.saved:
            count.labels(namespace, spec.name, "save", "saved").inc(len(report.saved))
        if cut:
            count.labels(namespace, spec.name, "save", "timeout").inc(len(cut))
        if report.error is not None or failed:
            count.labels(namespace, spec.name, "save", "failed").inc(len(failed) or 1)
            why = report.error or "; ".join(f"slot {k.slot}: {k.reason}" for k in failed)
            self._event(logger, "Warning", KV_SAVE_FAILED,
                        f"{spec.name}'s slots not all saved (the unload goes on): {why}")
        elif cut:
            self._event(logger, "Warning", KV_SAVE_FAILED,
                        f"{len(cut)} of {spec.name}'s slots not saved within saveTimeout "
                        f"{kv.save_timeout:g}s (the unload goes on)")

    async def _restore(self, namespace: str, action: RestoreSlots) -> None:
        target = self._target(namespace, action.member)
        if target is None:
            return
        value = (target.body.get("status") or {}).get("kvCache")
        if value is None:
            return
        try:
            await self._restore_from(namespace, action, target, value)
        finally:
            # Restored or discarded, its files are named by no manifest any more: removed
            # beside, the member's load does not wait for it.
            self.ctx.background.run(functools.partial(
                self.prune.after_restore, target.spec, target.pod_uid, target.prune_at,
                target.logger), f"kv-prune-{action.member}")

    async def _restore_from(self, namespace: str, action: RestoreSlots, target: _Target,
                            value: Any) -> None:
        ctx = self.ctx
        files, _, spec, kv, address, logger, _, _ = target
        count = ctx.metrics.kv_slots_total
        try:
            manifest = io.manifest_from(value)
        except ValueError as e:
            report = io.RestoreReport(refused=str(e))
        else:
            left = max(0.0, action.deadline - ctx.clock())
            try:
                report = await asyncio.wait_for(files.restore(
                    address, manifest, io.IdentityArgs(spec.model or "", spec.args),
                    ctx.clock(), kv.max_age), left)
            except TimeoutError:
                count.labels(namespace, spec.name, "restore", "timeout").inc()
                report = io.RestoreReport(refused=f"not restored within {left:.1f}s")
        await self._write(namespace, action.member, None)
        if report.refused is not None:
            logger.info("saved slots of %s discarded: %s", spec.name, report.refused)
            count.labels(namespace, spec.name, "restore", "discarded").inc()
            self._event(logger, "Normal", KV_CACHE_DISCARDED,
                        f"saved slots of {spec.name} discarded: {report.refused}")
            return
        tokens = sum(x.tokens for x in report.restored)
        if report.restored:
            count.labels(namespace, spec.name, "restore", "restored").inc(len(report.restored))
        if report.skipped:
            count.labels(namespace, spec.name, "restore", "failed").inc(len(report.skipped))
        skipped = "; ".join(f"slot {k.slot}: {k.reason}" for k in report.skipped)
        logger.info("restored %d slots of %s (%d tokens)%s", len(report.restored), spec.name,
                    tokens, f", not {skipped}" if skipped else "")
        self._event(logger, "Normal", KV_CACHE_RESTORED,
                    f"{len(report.restored)} slots of {spec.name} restored ({tokens} tokens)"
                    + (f"; not restored: {skipped}" if skipped else ""))
