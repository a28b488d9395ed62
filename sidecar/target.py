"""What the activation answers a request with: a `Target` to send it to, or an
`ActivationError`, which the proxy answers with its status and Retry-After."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    base_url: str  # "http://127.0.1.3:8080", no trailing slash
    backend: str
    pool: str | None


class ActivationError(Exception):
    """A request the activator cannot serve: the proxy answers `status` with Retry-After."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 503,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after = retry_after
