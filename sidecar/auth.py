"""Optional API keys for the router, read from a mounted Secret.

The Secret file holds one key per line (blank lines and `#` comments ignored). With no
file, or an empty one, the router is open. Keys are compared in constant time, and every
key is compared so that the time does not tell which one nearly matched.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

_BEARER = "bearer "


@dataclass(frozen=True)
class ApiKeys:
    keys: tuple[bytes, ...]

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def allows(self, authorization: str | None) -> bool:
        """True if auth is off, or the `Authorization` header carries a known bearer key."""
        if not self.keys:
            return True
        if authorization is None or authorization[: len(_BEARER)].lower() != _BEARER:
            return False
        offered = authorization[len(_BEARER) :].strip().encode()
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(offered, key)
        return matched


NO_KEYS = ApiKeys(keys=())


def parse_keys(text: str) -> ApiKeys:
    lines = (line.strip() for line in text.splitlines())
    return ApiKeys(keys=tuple(line.encode() for line in lines if line and not line.startswith("#")))


def load_keys(path: Path | None) -> ApiKeys:
    """Read the keys file; a missing path means no keys. Unreadable files raise OSError."""
    if path is None:
        return NO_KEYS
    return parse_keys(path.read_text())
