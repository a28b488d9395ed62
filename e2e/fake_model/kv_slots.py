"""What the fake server keeps in its slots' KV caches, and its slot files, as llama.cpp's
server does with `--slot-save-path` (tools/server/server-context.cpp): pure, no I/O but
the file a save writes and a restore reads.

A slot caches the tokens of its last prompt and what it generated (the fake's tokens are
the prompt's words, as `replies.count_tokens` counts them). A new prompt in that slot
reuses the longest common prefix: `cache_n` tokens come from the cache and `prompt_n` are
computed; at least one is always computed, as llama.cpp evaluates the last prompt token
again. A save writes the slot's tokens to a file, with what makes them valid (the model
and the slot's context); a restore of a file made for another model or context, or of
no file, fails as llama.cpp's does, with "No available space in KV cache or invalid slot
save file". A request picks the free slot whose cache shares the longest prefix with its
prompt (llama.cpp's `--slot-prompt-similarity` choice, simplified), or the one it names
by `id_slot`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FORMAT = "modelpool-fake-slot-1"
INVALID_FILE = "No available space in KV cache or invalid slot save file"
# fs_validate_filename (llama.cpp common.cpp): what a slot file's name may not hold.
_FORBIDDEN = set(':*?"<>|/\\') | {"\ufffd", "\ufeff", "\uff0e", "\u2215", "\u2216"}


def valid_filename(name: str) -> bool:
    """llama.cpp's rule for a slot file's name: no path, no control or reserved
    characters, no leading space, no trailing space or dot, no `..`."""
    if not name or len(name.encode()) > 255 or name == ".":
        return False
    for c in name:
        code = ord(c)
        if code <= 0x1F or code == 0x7F or 0x80 <= code <= 0x9F or c in _FORBIDDEN:
            return False
        if 0xD800 <= code <= 0xDFFF:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name)


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Reuse:
    cache_n: int
    prompt_n: int


def reuse(cached: Sequence[str], prompt: Sequence[str]) -> Reuse:
    """How much of `prompt` a slot caching `cached` serves from its cache."""
    hit = min(common_prefix(cached, prompt), max(0, len(prompt) - 1))
    return Reuse(hit, len(prompt) - hit)


def best_slot(free: Sequence[int], caches: dict[int, list[str]],
              prompt: Sequence[str]) -> int | None:
    """The free slot whose cache shares the longest prefix with `prompt` (the lowest id
    among equals), or None when none shares any."""
    best, best_n = None, 0
    for slot in sorted(free):
        n = common_prefix(caches.get(slot, []), prompt)
        if n > best_n:
            best, best_n = slot, n
    return best


def file_body(model: str, n_ctx: int, tokens: Sequence[str]) -> bytes:
    return json.dumps({"format": FORMAT, "model": model, "n_ctx": n_ctx,
                       "tokens": list(tokens)}).encode()


def read_file(path: Path, model: str, n_ctx: int) -> list[str] | None:
    """The tokens a slot file holds if it was made for this model and context; else
    None (no file, not one of ours, another model or context)."""
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        return None
    if body.get("model") != model or body.get("n_ctx") != n_ctx:
        return None
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    if len(tokens) > n_ctx:
        return None
    return tokens
