"""The reconciler's logging: JSON lines (from telemetry), and a logger that speaks of one
object and can post it an Event.

An operator reads a reconciler through two windows: its log and `kubectl describe`. The
`ObjectLogger` writes to both at once (as kopf's does): every line carries the object's
kind, namespace and name, and `event()` also posts a Kubernetes Event on the object.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from telemetry.logs import configure_logging

# Posts (type, reason, message) about the object; given by the shell, which owns the API.
EventPoster = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]


def setup_logging(level: str = "INFO") -> None:
    """JSON lines on stderr; the HTTP and API client libraries speak only of trouble."""
    configure_logging(level)
    for noisy in ("httpx", "httpcore", "kr8s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class ObjectLogger(logging.LoggerAdapter[logging.Logger]):
    """Log lines about one object; `event` also posts a Kubernetes Event on it."""

    def __init__(
        self, logger: logging.Logger, body: Mapping[str, Any], poster: EventPoster | None = None,
        final: tuple[type[Exception], ...] = (),
    ) -> None:
        """`final`: the poster's errors that say the object itself is past reporting on
        (its namespace is being deleted); `event` raises those instead of logging them."""
        meta = body.get("metadata") or {}
        extra = {  # not "name": LogRecord has one
            "object_kind": body.get("kind"),
            "object_namespace": meta.get("namespace"),
            "object_name": meta.get("name"),
        }
        super().__init__(logger, extra)
        self.body = body
        self._poster = poster
        self._final = final

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

    async def event(self, type_: str, reason: str, message: str) -> None:
        level = logging.WARNING if type_ == "Warning" else logging.INFO
        self.log(level, "%s: %s", reason, message, extra={"reason": reason})
        if self._poster is not None:
            try:
                await self._poster(self.body, type_, reason, message)
            except self._final:
                raise
            except Exception as e:  # an Event is a courtesy: never fail a reconcile for it
                self.warning("could not post Event %s: %s", reason, e)
