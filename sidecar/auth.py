"""Optional API keys for the router, read from a mounted Secret.

The Secret file holds one key per line (blank lines and `#` comments ignored). With no
file, or an empty one, the router is open. A client sends its key the way its SDK does:
`Authorization: Bearer <key>` (OpenAI clients) or `x-api-key: <key>` (Anthropic clients).
Keys are compared in constant time, and every key is compared so that the time does not
tell which one nearly matched.
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

    def allows(self, authorization: str | None, api_key: str | None = None) -> bool:
        """True if auth is off, or a known key comes as the `Authorization` header's bearer
        token or as the `x-api-key` header (`api_key`)."""
        if not self.keys:
            return True
        offered: list[bytes] = []
        if authorization is not None and authorization[: len(_BEARER)].lower() == _BEARER:
            offered.append(authorization[len(_BEARER) :].strip().encode())
        if api_key is not None:
            offered.append(api_key.strip().encode())
        matched = False
        for candidate in offered:
            for key in self.keys:
                matched |= hmac.compare_digest(candidate, key)
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
