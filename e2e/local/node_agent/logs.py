"""The agent's logging: JSON lines (telemetry.logs), and a logger whose records carry the
pod they speak of."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from telemetry.logs import configure_logging


class PodLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that names its pod (`namespace/name`) in every record."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(kwargs.get("extra") or {})
        extra["pod"] = (self.extra or {}).get("pod")
        kwargs["extra"] = extra
        return msg, kwargs


def configure(level: int = logging.INFO) -> None:
    """JSON lines on stderr; the HTTP client library speaks only of trouble."""
    configure_logging(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)
