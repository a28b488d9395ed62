"""Saving a llama.cpp member's slots to files on its claim and restoring them into a new
process: the HTTP half of `reconciler.kv_cache`, over llama-server's `/slots` and
`POST /slots/{id}?action=save|restore` (a server started with `--slot-save-path`).

Like the idle probe, it talks to one pod's own address. Nothing here raises past `save`
or `restore`: a server that refuses (501, no `--slot-save-path`), a slot it cannot save or
restore (400), a timeout or a dropped connection is reported, slot by slot, and the swap
goes on. A slot busy with a generation defers its action until the generation ends
(llama.cpp queues it): each save is bounded by the time left under the cap, and a save
still waiting then is reported as cut by the time cap (llama-server may still write that
file later; no manifest names it).

What a saved slot is valid for (`kv_cache.Identity`) is read where the reconciler can see
it: the model argument and the cache-changing arguments it rendered, and the slot's
context from `/slots`. The model file's size and modification time are not visible over
HTTP and are recorded as 0, so a model file replaced under the same path with one of the
same shape is not told apart; llama.cpp's own checks of the file's layers and types still
refuse one of another shape. The identity is folded into every file name
(`{member}-{uid8}-{identity8}-slot{N}.bin`), so a save under one identity never writes
over a file that a manifest of another names.

The manifest stays off the claim (the reconciler cannot write files there): it is the
ModelServer's `status.kvCache`, built by `status_value` after a save and read back by
`manifest_from`. A manifest is written only once its saves have answered, so a file cut
short by a killed pod is named by none; the caller clears `status.kvCache` before a save
starts (a new save rewrites the same names) and after a restore consumed it.

Removing files goes to the pod's other container, kv-files (`reconciler.kv_files`), which
has the claim mounted: `prune` names the owners whose files stay.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from reconciler import kv_cache
from reconciler.kv_cache import Caps, Identity, Manifest, Saved, Slot
from reconciler.spec import KvCache

log = logging.getLogger(__name__)

Address = tuple[str, int]
Clock = Callable[[], float]

# No size cap: room for any file.
UNLIMITED_BYTES = 1 << 62
_ECHO = 200  # characters of a server's answer kept in a reason


@dataclass(frozen=True)
class IdentityArgs:
    """What the reconciler rendered for the process: its `--model` and its arguments."""

    model: str
    args: tuple[str, ...] = ()


def identity_of(given: IdentityArgs, n_ctx: int) -> Identity:
    """The identity a slot of this process is saved under (size and mtime unknown: 0)."""
    return Identity(given.model, 0, 0, n_ctx, kv_cache.cache_args(given.args))


def identity_hash(identity: Identity) -> str:
    """Eight hex digits of the identity's sha256, for file names."""
    body = json.dumps({**asdict(identity), "args": list(identity.args)}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:8]


def slot_file(member: str, uid: str, identity: Identity, slot: int) -> str:
    """`kv_cache.file_name` with the identity folded in before the slot number."""
    stem, sep, tail = kv_cache.file_name(member, uid, slot).rpartition("-slot")
    return f"{stem}-{identity_hash(identity)}{sep}{tail}"


@dataclass(frozen=True)
class Skipped:
    """A slot not saved or not restored, and why."""

    slot: int
    reason: str


@dataclass(frozen=True)
class SaveReport:
    """What one save did: the slots written (`Saved.tokens` is llama-server's `n_saved`,
    `Saved.bytes` its `n_written`), those left and why, and how long it took. `error`
    says why nothing could be saved at all (None when slots were tried)."""

    identity: Identity | None
    saved: tuple[Saved, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class Restored:
    slot: int
    file: str
    tokens: int  # n_restored
    bytes: int  # n_read


@dataclass(frozen=True)
class RestoreReport:
    """What one restore did; `refused` says why nothing was tried (another identity, too
    old, a server that cannot answer)."""

    restored: tuple[Restored, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    refused: str | None = None


@dataclass(frozen=True)
class PruneReport:
    """What a member pod's kv-files container removed, what it could not (file, why), or
    why it could not be asked."""

    removed: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    error: str | None = None


def status_value(report: SaveReport, now: float) -> dict[str, Any] | None:
    """`status.kvCache` after a save: the manifest of what was saved, or None (the field
    removed) when nothing was."""
    if report.identity is None or not report.saved:
        return None
    value: dict[str, Any] = json.loads(
        Manifest(report.identity, now, report.saved).to_json())
    return value


def manifest_from(value: object) -> Manifest:
    """`status.kvCache` read back; ValueError naming what is wrong with it."""
    if not isinstance(value, dict):
        raise ValueError("status.kvCache is not an object")
    return Manifest.from_json(json.dumps(value))


class _Refused(Exception):
    """The server answered a slot action with an error; the message is for people."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SlotFiles:
    """Saves and restores the slots of one pod; the session is the reconciler's."""

    def __init__(self, session: aiohttp.ClientSession, timeout: float = 3.0,
                 restore_timeout: float = 30.0) -> None:
        self._session = session
        self._timeout = timeout
        self._restore_timeout = restore_timeout

    async def save(self, address: Address, member: str, uid: str, kv: KvCache,
                   identity_args: IdentityArgs, clock: Clock) -> SaveReport:
        """Every slot that holds tokens saved, most recently used first, while
        `kv_cache.may_save_another` allows within `kv.save_timeout` and `kv.max_bytes`."""
        start = clock()
        caps = Caps(kv.save_timeout, kv.max_bytes or UNLIMITED_BYTES)
        try:
            slots = await self._slots(address, min(self._timeout, caps.seconds))
        except _Refused as e:
            log.info("kv save of %s skipped: %s", member, e)
            return SaveReport(None, seconds=clock() - start, error=str(e))
        identity = identity_of(identity_args, _context(slots))
        saved: list[Saved] = []
        skipped: list[Skipped] = []
        written = largest = 0
        order = kv_cache.save_order(slots)
        for n, slot in enumerate(order):
            elapsed = clock() - start
            if not kv_cache.may_save_another(caps, elapsed, written, largest):
                why = "time cap" if elapsed >= caps.seconds else "size cap"
                skipped += [Skipped(s, why) for s in order[n:]]
                break
            name = slot_file(member, uid, identity, slot)
            try:
                body = await self._action(address, slot, "save", name,
                                          caps.seconds - elapsed)
            except TimeoutError:
                skipped.append(Skipped(slot, "time cap"))
                continue
            except _Refused as e:
                if e.status == 501:
                    skipped += [Skipped(s, str(e)) for s in order[n:]]
                    break
                skipped.append(Skipped(slot, str(e)))
                continue
            tokens, size = _count(body, "n_saved"), _count(body, "n_written")
            written += size
            largest = max(largest, size)
            if tokens > 0:
                saved.append(Saved(slot, name, tokens, size))
            else:
                skipped.append(Skipped(slot, "empty"))
        report = SaveReport(identity, tuple(saved), tuple(skipped), clock() - start)
        log.info("kv save of %s: %d slots saved (%d bytes), %d skipped, in %.3fs", member,
                 len(saved), written, len(skipped), report.seconds)
        return report

    async def restore(self, address: Address, manifest: Manifest,
                      identity_args: IdentityArgs, now: float,
                      max_age: float) -> RestoreReport:
        """The manifest's slots restored into the same slot ids when it was made for this
        process (`kv_cache.restorable`): the identity's context is read from `/slots`, as
        `save` read it. A slot the server refuses is reported and the rest go on."""
        try:
            listed = await self._slots(address, self._timeout)
        except _Refused as e:
            return RestoreReport(refused=str(e))
        identity = identity_of(identity_args, _context(listed))
        why = kv_cache.restorable(manifest, identity, now, max_age)
        if why is not None:
            log.info("kv manifest not restored: %s", why)
            return RestoreReport(refused=why)
        slots = {s.id: s for s in listed}
        plan = kv_cache.restore_plan(manifest, slots)
        skipped = [Skipped(s.slot, "no such slot, or its context is too small")
                   for s in manifest.slots if s not in plan]
        restored: list[Restored] = []
        for saved in plan:
            try:
                body = await self._action(address, saved.slot, "restore", saved.file,
                                          self._restore_timeout)
            except TimeoutError:
                skipped.append(Skipped(saved.slot, "timed out"))
                continue
            except _Refused as e:
                skipped.append(Skipped(saved.slot, str(e)))
                continue
            restored.append(Restored(saved.slot, saved.file, _count(body, "n_restored"),
                                     _count(body, "n_read")))
        return RestoreReport(tuple(restored), tuple(skipped))

    async def prune(self, address: Address, keep: Collection[str]) -> PruneReport:
        """Ask a member pod's kv-files container at `address` (`reconciler.kv_files`) to
        remove every slot file on its claim whose owner is not in `keep`."""
        host, port = address
        url = f"http://{host}:{port}/prune"
        try:
            async with self._session.post(url, json={"keep": sorted(keep)},
                                          timeout=_bound(self._timeout)) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return PruneReport(error=f"{url}: {type(e).__name__}")
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if status != 200 or not isinstance(body, dict):
            return PruneReport(error=f"{url} answered {status}: {text[:_ECHO]}")
        removed = body.get("removed")
        failed = body.get("failed")
        return PruneReport(
            tuple(str(n) for n in removed) if isinstance(removed, list) else (),
            tuple((str(f.get("file")), str(f.get("error"))) for f in failed
                  if isinstance(f, dict)) if isinstance(failed, list) else ())

    async def _slots(self, address: Address, seconds: float) -> list[Slot]:
        host, port = address
        url = f"http://{host}:{port}/slots"
        try:
            async with self._session.get(
                    url, timeout=_bound(seconds)) as response:
                text = await response.text()
                if response.status != 200:
                    raise _Refused(response.status,
                                   f"{url} answered {response.status}: {text[:_ECHO]}")
                return kv_cache.slots_from(json.loads(text))
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise _Refused(0, f"{url}: {type(e).__name__}") from e
        except (ValueError, RecursionError) as e:
            raise _Refused(0, f"{url}: {str(e)[:_ECHO]}") from e

    async def _action(self, address: Address, slot: int, action: str, name: str,
                      seconds: float) -> dict[str, Any]:
        """One slot action's answer; TimeoutError past `seconds`, _Refused otherwise."""
        host, port = address
        url = f"http://{host}:{port}/slots/{slot}?action={action}"
        try:
            async with self._session.post(
                    url, json={"filename": name},
                    timeout=_bound(seconds)) as response:
                text = await response.text()
                status = response.status
        except TimeoutError:
            raise
        except (aiohttp.ClientError, OSError) as e:
            raise _Refused(0, f"{action} slot {slot}: {type(e).__name__}") from e
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if status != 200 or not isinstance(body, dict):
            raise _Refused(status, f"{action} slot {slot} answered {status}: "
                                   f"{_message(body, text)[:_ECHO]}")
        return body


def _bound(seconds: float) -> aiohttp.ClientTimeout:
    """A total timeout of `seconds`, however few (aiohttp reads 0 as none)."""
    return aiohttp.ClientTimeout(total=max(seconds, 0.001))


def _context(slots: Sequence[Slot]) -> int:
    """The slots' context (llama-server gives every slot the same)."""
    return max((s.n_ctx for s in slots), default=0)


def _count(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _message(body: object, text: str) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return text
