"""The `Saving` and `Restoring` steps of an unload and a load, for members that keep their
KV cache (`ModelServer.spec.kvCache.persist`), as pure bookkeeping shared by both pool
machines (`reconciler.swap`, `reconciler.residency`). No awaits, no clock reads, no I/O:
the shell performs a `SaveSlots` or a `RestoreSlots` (`reconciler.kv_slots_io`) and
answers with a `SaveResult` or a `RestoreResult`.

The rules:

- A member that persists is saved after its drain found it idle and before it is scaled
  to 0, whatever unloads it: a swap, an eviction, reclaim, idleUnloadAfter. While its
  save is pending it keeps running (the machine wants it at 1, though it is no longer
  resident); it is scaled to 0 when the shell answers or when the save's deadline passes,
  whichever comes first. A save past its deadline is abandoned (`KvSaveAbandoned`, a
  Warning and a count) and never holds the unload longer.
- A save's deadline is its `saveTimeout` from when it starts, and never later than the
  end of the swap's `swapBudget`.
- A load of a member that persists and has saved slots (a manifest in its status) goes
  through `Restoring` once its pod is Ready, before the pool reports it resident: the
  routers send it nothing until its slots are back. A restore has the same time cap as a
  save; past it the member is resident without them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

KV_SAVE_ABANDONED = "KvSaveAbandoned"
KV_RESTORE_ABANDONED = "KvRestoreAbandoned"


@dataclass(frozen=True)
class Pending:
    """A save or restore under way: its member, when it started and its deadline."""

    member: str
    started: float
    deadline: float


# Actions


@dataclass(frozen=True)
class SaveSlots:
    """Save `member`'s slots, answering by `deadline` at the latest."""

    member: str
    deadline: float


@dataclass(frozen=True)
class RestoreSlots:
    """Restore `member`'s saved slots into its new process, by `deadline` at the latest."""

    member: str
    deadline: float


@dataclass(frozen=True)
class RecordKvAbandoned:
    """A save or a restore (`kind`: "save" or "restore") passed its deadline unanswered."""

    member: str
    kind: str


# Events


@dataclass(frozen=True)
class SaveResult:
    """The shell's answer to a SaveSlots (whatever it saved: the unload goes on)."""

    member: str


@dataclass(frozen=True)
class RestoreResult:
    """The shell's answer to a RestoreSlots."""

    member: str


Pendings = Mapping[str, Pending]


def save_deadline(timeout: float, now: float, budget_end: float | None) -> float:
    """When a save started now must be over: its cap, within the swap's budget."""
    end = now + timeout
    return end if budget_end is None else min(end, budget_end)


def begin(pending: Pendings, members: Iterable[str], caps: Mapping[str, float], now: float,
          budget_end: float | None, restore: bool = False
          ) -> tuple[dict[str, Pending], list[SaveSlots | RestoreSlots]]:
    """Start a save (or, with `restore`, a restore) of each of `members` that keeps its
    cache (a cap in `caps`) and has none under way; returns every pending one, and the
    actions that start the new ones."""
    out = dict(pending)
    actions: list[SaveSlots | RestoreSlots] = []
    for member in members:
        if member not in caps or member in out:
            continue
        deadline = save_deadline(caps[member], now, None if restore else budget_end)
        out[member] = Pending(member, now, deadline)
        actions.append(RestoreSlots(member, deadline) if restore
                       else SaveSlots(member, deadline))
    return out, actions


def answer(pending: Pendings, member: str) -> dict[str, Pending] | None:
    """`pending` without `member`'s, or None when none of its was pending (an answer to
    a question no longer asked)."""
    if member not in pending:
        return None
    return {m: p for m, p in pending.items() if m != member}


def expire(pending: Pendings, now: float) -> tuple[dict[str, Pending], list[str]]:
    """The pending ones whose deadline has not passed, and the members of those that did."""
    late = sorted(m for m, p in pending.items() if now >= p.deadline)
    return {m: p for m, p in pending.items() if m not in late}, late


@dataclass(frozen=True)
class Abandonment:
    """A save or restore past its deadline: what to record, and the Warning's reason and
    message."""

    record: RecordKvAbandoned
    reason: str
    message: str


@dataclass(frozen=True)
class Expired:
    """The saves and restores still pending once the late ones are abandoned, and those,
    saves first."""

    saves: dict[str, Pending]
    restores: dict[str, Pending]
    abandoned: list[Abandonment]

    @property
    def late_saves(self) -> list[str]:
        """The members whose save was abandoned: their unload goes on."""
        return [a.record.member for a in self.abandoned if a.record.kind == "save"]


def expire_both(saves: Pendings, restores: Pendings, now: float) -> Expired | None:
    """Abandon the saves and restores past their deadline; None when none is."""
    saves_left, late_saves = expire(saves, now)
    restores_left, late_restores = expire(restores, now)
    if not late_saves and not late_restores:
        return None
    gone = [Abandonment(RecordKvAbandoned(member, kind), *abandoned(member, kind, pending[member]))
            for kind, late, pending in (("save", late_saves, saves),
                                        ("restore", late_restores, restores))
            for member in late]
    return Expired(saves_left, restores_left, gone)


def next_deadline(*pendings: Pendings) -> float | None:
    return min((p.deadline for pending in pendings for p in pending.values()), default=None)


def abandoned(member: str, kind: str, pending: Pending) -> tuple[str, str]:
    """The Warning's reason and message for a save or restore past its deadline."""
    reason = KV_SAVE_ABANDONED if kind == "save" else KV_RESTORE_ABANDONED
    what = "saving" if kind == "save" else "restoring"
    return reason, (f"{what} {member}'s slots did not answer within "
                    f"{pending.deadline - pending.started:g}s: the "
                    f"{'unload' if kind == 'save' else 'load'} goes on without them")
