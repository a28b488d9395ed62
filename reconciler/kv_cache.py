"""Keeping a llama.cpp member's conversations across an unload, as pure decisions: which
slots to save and in what order, what makes a saved slot valid for a later process, and
the manifest that records it. The reconciler's shell performs the saves and restores
(`POST /slots/{id}?action=save|restore` of a llama-server started with
`--slot-save-path`); this module reads and writes nothing.

What llama.cpp itself checks when it restores a slot file (llama_state_seq_load_file in
src/llama-kv-cache.cpp): the layer count, that the slot has cells for every token, the V
cache's transposition (flash attention on or off), the key and value rotation, and each
layer's key and value types and row sizes. A file that fails those is refused with "No
available space in KV cache or invalid slot save file". What it does not check, and the
manifest must: that the file was made by the same model file (another model of the same
shape would restore garbage), and the arguments that change what the cached keys and
values mean without changing their shape (RoPE scaling and frequency, YaRN, LoRA
adapters, control vectors, metadata overrides, SWA). So a saved slot is restored only
when its manifest's identity equals the new process's: the model file (path, size,
modification time), the slot's context (`n_ctx` from `/slots`), and every argument below
with its value, in order.

Saving: the slots that hold tokens (a task ran on them), most recently used first (a
larger `id_task` is a later task), until the time cap or the size cap would be passed.

Removing: before a member's process starts, the files under its own name on the claim
that no restore will trust are removed (`stale_files`): those of an earlier member of the
same name (another UID), those older than the age cap, and the oldest past the size cap.
While members run, the files of every owner not kept are removed (`unkept_files`): a
member's own once its manifest is consumed or discarded, and those of a member deleted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"

# llama-server arguments that change what a cached key or value means, by every spelling;
# the value is how many values each takes.
_CACHE_ARGS: dict[str, tuple[str, int]] = {}
for _names, _arity in (
    (("-ctk", "--cache-type-k"), 1),
    (("-ctv", "--cache-type-v"), 1),
    (("-fa", "--flash-attn"), 1),
    (("-kvu", "--kv-unified"), 0),
    (("--swa-full",), 0),
    (("--rope-scaling",), 1),
    (("--rope-scale",), 1),
    (("--rope-freq-base",), 1),
    (("--rope-freq-scale",), 1),
    (("--yarn-orig-ctx",), 1),
    (("--yarn-ext-factor",), 1),
    (("--yarn-attn-factor",), 1),
    (("--yarn-beta-slow",), 1),
    (("--yarn-beta-fast",), 1),
    (("--override-kv",), 1),
    (("--lora",), 1),
    (("--lora-scaled",), 1),
    (("--control-vector",), 1),
    (("--control-vector-scaled",), 1),
    (("--control-vector-layer-range",), 2),
):
    for _name in _names:
        _CACHE_ARGS[_name] = (_names[-1], _arity)


def cache_args(argv: Sequence[str]) -> tuple[str, ...]:
    """The arguments of a llama-server command line that change its KV cache's meaning,
    each under its long name with its values (`--name=value` split), in order."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        known = _CACHE_ARGS.get(name if eq and name.startswith("--") else arg)
        if known is None:
            i += 1
            continue
        canonical, arity = known
        if eq and name.startswith("--"):
            out += [canonical, inline]
            i += 1
            continue
        out += [canonical, *argv[i + 1:i + 1 + arity]]
        i += 1 + arity
    return tuple(out)


@dataclass(frozen=True)
class Identity:
    """What a saved slot is valid for."""

    model: str
    model_size: int
    model_mtime: int
    n_ctx: int
    args: tuple[str, ...] = ()

    def differences(self, other: Identity) -> list[str]:
        """The fields that differ, named: empty when a slot saved under `self` may be
        restored into a process of `other`."""
        return [name for name in ("model", "model_size", "model_mtime", "n_ctx", "args")
                if getattr(self, name) != getattr(other, name)]


@dataclass(frozen=True)
class Slot:
    """A slot as `/slots` lists it."""

    id: int
    n_ctx: int
    processing: bool
    last_task: int | None  # None: no task ever ran on it, so it holds nothing


def slots_from(listed: object) -> list[Slot]:
    """`/slots`' answer (llama-server's and the fake's) as Slots; ValueError when it is
    not a list of slot objects."""
    if not isinstance(listed, list):
        raise ValueError("/slots did not answer a list")
    out = []
    for entry in listed:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), int):
            raise ValueError(f"/slots listed {entry!r}, not a slot")
        task = entry.get("id_task")
        out.append(Slot(entry["id"], int(entry.get("n_ctx") or 0),
                        bool(entry.get("is_processing")),
                        task if isinstance(task, int) and task >= 0 else None))
    return out


def save_order(slots: Sequence[Slot]) -> list[int]:
    """The slots worth saving, most recently used first."""
    used = [s for s in slots if s.last_task is not None]
    return [s.id for s in sorted(used, key=lambda s: (-(s.last_task or 0), s.id))]


@dataclass(frozen=True)
class Caps:
    seconds: float
    bytes: int


def may_save_another(caps: Caps, elapsed: float, written: int, largest: int) -> bool:
    """Whether another save may start: time left, and room for a file as large as the
    largest written so far (the first one always may, within the time)."""
    return elapsed < caps.seconds and written + largest <= caps.bytes


def file_name(member: str, uid: str, slot: int) -> str:
    """A slot file's name: the member's name and the first part of its UID, so two members
    (or a member deleted and created again under the same name) never share one; a name
    llama-server accepts (no path, no `:`)."""
    return f"{member}-{uid.split('-')[0]}-slot{slot}.bin"


@dataclass(frozen=True)
class Saved:
    slot: int
    file: str
    tokens: int
    bytes: int


@dataclass(frozen=True)
class Manifest:
    identity: Identity
    saved_at: float
    slots: tuple[Saved, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        body: dict[str, Any] = {"version": MANIFEST_VERSION, "savedAt": self.saved_at,
                                "identity": asdict(self.identity),
                                "slots": [asdict(s) for s in self.slots]}
        body["identity"]["args"] = list(self.identity.args)
        return json.dumps(body, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """ValueError naming what is wrong with a manifest that cannot be trusted."""
        try:
            body = json.loads(text)
        except ValueError as e:
            raise ValueError(f"the manifest is not JSON: {e}") from None
        if not isinstance(body, dict) or body.get("version") != MANIFEST_VERSION:
            raise ValueError("the manifest is not version 1")
        try:
            ident = body["identity"]
            identity = Identity(str(ident["model"]), int(ident["model_size"]),
                                int(ident["model_mtime"]), int(ident["n_ctx"]),
                                tuple(str(a) for a in ident.get("args", ())))
            slots = tuple(Saved(int(s["slot"]), str(s["file"]), int(s["tokens"]),
                                int(s["bytes"])) for s in body["slots"])
            return cls(identity, float(body["savedAt"]), slots)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the manifest lacks or mistypes a field: {e}") from None


def restorable(manifest: Manifest, now_identity: Identity, now: float,
               max_age: float) -> str | None:
    """Why the manifest's slots must not be restored into a process of `now_identity`
    (None: they may): another model or context, other cache arguments, or too old."""
    differ = manifest.identity.differences(now_identity)
    if differ:
        return "made for another " + ", ".join(differ)
    if now - manifest.saved_at > max_age:
        return f"older than {max_age:g}s"
    return None


def restore_plan(manifest: Manifest, slots: Mapping[int, Slot]) -> list[Saved]:
    """The saved slots to restore into the new process: each into the same slot id, where
    that slot exists and its context holds the tokens."""
    return [s for s in manifest.slots
            if s.slot in slots and 0 < s.tokens <= slots[s.slot].n_ctx]


# `{member}-{uid8}-{identity8}-slot{N}.bin` (kv_slots_io.slot_file); the member's name may
# hold dashes, so it is read from the right.
_SLOT_FILE = re.compile(r"^(?P<member>.+)-(?P<uid>[0-9a-f]{8})-(?P<identity>[0-9a-f]{8})"
                        r"-slot(?P<slot>[0-9]+)\.bin$")


@dataclass(frozen=True)
class OnDisk:
    """A file on the claim: its name, size and modification time."""

    name: str
    bytes: int
    mtime: float


def stale_files(files: Sequence[OnDisk], member: str, uid: str, now: float, max_age: float,
                max_bytes: int | None) -> list[str]:
    """The names of `member`'s slot files to remove before its process starts: another
    UID's (a member deleted and made again under the name), those older than `max_age`,
    and past `max_bytes` the oldest of the rest. Files of other members are left alone."""
    uid8 = uid.split("-")[0]
    mine = [(f, m) for f in files if (m := _SLOT_FILE.match(f.name)) and m["member"] == member]
    gone = {f.name for f, m in mine if m["uid"] != uid8 or now - f.mtime > max_age}
    kept = sorted((f for f, _ in mine if f.name not in gone), key=lambda f: (-f.mtime, f.name))
    total = 0
    for f in kept:
        total += f.bytes
        if max_bytes is not None and total > max_bytes:
            gone.add(f.name)
    return sorted(gone)


def owner(member: str, uid: str) -> str:
    """The part of a slot file's name that says whose it is: `{member}-{uid8}`."""
    return f"{member}-{uid.split('-')[0]}"


def unkept_files(names: Iterable[str], keep: Collection[str]) -> list[str]:
    """The slot files among `names` whose owner (`owner`) is not in `keep`: a member's
    after its manifest was consumed or discarded, or a member's that no longer exists.
    Names that are no slot file are left alone."""
    return sorted(n for n in names
                  if (m := _SLOT_FILE.match(n)) and f"{m['member']}-{m['uid']}" not in keep)
