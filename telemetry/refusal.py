"""What the API server said when it refused a request, read from its answer.

Every program here sends its calls through kr8s with `raise_for_status=False` and reads
the status itself. kr8s's own reading of a 401 or 403 re-loads the credentials and
replaces its HTTP session, closing the old one under every watch and write in flight on
it. A 403 is an answer a controller meets every day, and the credentials are not at fault:
a namespace being deleted refuses new objects, and a RoleBinding created beside the pod
that uses it reaches the authorizer a moment after the pod starts. One such answer must
not cut the watches of every other namespace. Only the reading lives here: each
program's own kube module makes the call and turns a `Refusal` into its own errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_TRUNCATE = 300


@dataclass(frozen=True)
class Refusal:
    code: int  # the HTTP status
    reason: str  # the Status body's reason (Forbidden, NotFound, Conflict, Expired...), or ""
    message: str  # the Status body's message, else the start of the body

    def __str__(self) -> str:
        return f"HTTP {self.code}: {self.message}" if self.message else f"HTTP {self.code}"


def read_refusal(code: int, body: bytes) -> Refusal:
    """The refusal in an error answer: a metav1 Status when the body is one, else the
    body's first characters (a proxy in front of the server may answer in HTML)."""
    try:
        status = json.loads(body) if body else None
    except (ValueError, RecursionError):
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        reason = status.get("reason")
        return Refusal(code, reason if isinstance(reason, str) else "",
                       status["message"][:_TRUNCATE])
    return Refusal(code, "", body[:_TRUNCATE].decode("utf-8", "replace").strip())
