"""What the API server said when it refused a request, read from its answer.

Every program here sends its calls through kr8s with `raise_for_status=False` and reads
the status itself. kr8s's own reading of a 401 or 403 re-loads the credentials and
replaces its HTTP session, closing the old one under every watch and write in flight on
it. A 403 is an answer a controller meets every day, and the credentials are not at fault:
a namespace being deleted refuses new objects, and a RoleBinding created beside the pod
that uses it reaches the authorizer a moment after the pod starts. One such answer must
not cut the watches of every other namespace.

`answer` reads the status of a call (`kubecore.client` makes them), and each program's
kube module turns a `Refusal` into its own errors. A 401 renews the credentials on the
same session (`renew_token`) and goes once more. A watch reports a refusal as an ERROR
event whose object is the same Status (`status_refusal`). This module does not import
kr8s: the call comes in as a function, and `renew_token` speaks to the client it is given.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_TRUNCATE = 300


# The cause the API server's NamespaceLifecycle admission gives when it refuses a new
# object in a namespace that is being deleted.
NAMESPACE_TERMINATING = "NamespaceTerminating"


@dataclass(frozen=True)
class Refusal:
    code: int  # the HTTP status
    reason: str  # the Status body's reason (Forbidden, NotFound, Conflict, Expired...), or ""
    message: str  # the Status body's message, else the start of the body
    causes: tuple[str, ...] = ()  # the reasons of the Status body's details.causes

    def __str__(self) -> str:
        return f"HTTP {self.code}: {self.message}" if self.message else f"HTTP {self.code}"

    @property
    def namespace_terminating(self) -> bool:
        """Refused because its namespace is being deleted: nothing new goes into it again."""
        return NAMESPACE_TERMINATING in self.causes


def read_refusal(code: int, body: bytes) -> Refusal:
    """The refusal in an error answer: a metav1 Status when the body is one, else the
    body's first characters (a proxy in front of the server may answer in HTML)."""
    try:
        status = json.loads(body) if body else None
    except (ValueError, RecursionError):
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return _from_status(code, status)
    return Refusal(code, "", body[:_TRUNCATE].decode("utf-8", "replace").strip())


def status_refusal(status: Mapping[str, Any]) -> Refusal:
    """The refusal in a watch's ERROR event: its object is a metav1 Status, whose `code`
    stands for the HTTP status (0 when it has none)."""
    code = status.get("code")
    return _from_status(code if isinstance(code, int) else 0, status)


def _from_status(code: int, status: Mapping[str, Any]) -> Refusal:
    reason, message = status.get("reason"), status.get("message")
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, Mapping) else None
    return Refusal(
        code,
        reason if isinstance(reason, str) else "",
        message[:_TRUNCATE] if isinstance(message, str) else "",
        tuple(str(c.get("reason", "")) for c in causes if isinstance(c, Mapping))
        if isinstance(causes, list) else (),
    )


@contextlib.asynccontextmanager
async def answer(
    send: Callable[[], AbstractAsyncContextManager[Any]],
    refused: Callable[[Refusal], Exception],
    renew: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[Any]:
    """The response of `send()` (a call made with `raise_for_status=False`) when it is not
    an error. An error status raises `refused(the refusal)`; a 401, with `renew`, renews
    the credentials and sends once more."""
    renewed = renew is None
    while True:
        async with send() as response:
            if response.status_code == 401 and not renewed:
                renewed = True
                assert renew is not None
                await renew()
                continue
            if response.status_code >= 400:
                raise refused(read_refusal(response.status_code, await response.aread()))
            yield response
            return


async def renew_token(api: Any) -> None:
    """A kr8s client's credentials read again (a service account's token is rotated on
    disk) and its bearer token set on the session it has, which carries the watches: a new
    session would cut them."""
    logger.info("the API server answered 401: reading the credentials again")
    await api.auth.reauthenticate()
    session, token = getattr(api, "_session", None), api.auth.token
    if session is not None and token:
        session.headers["Authorization"] = f"Bearer {token}"
