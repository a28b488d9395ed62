"""Is the local cluster healthy? Plain HTTPS questions to its API server.

`up` and `status` are short synchronous commands, so this uses the standard library's
HTTP client with the admin's client certificate rather than an async Kubernetes client.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from e2e.local.paths import StateLayout


@dataclass(frozen=True)
class Answer:
    status: int  # 0 when no HTTP answer came at all
    body: bytes


class ApiProbe:
    """Reads from the API server as the cluster admin."""

    def __init__(self, layout: StateLayout, server: str, timeout: float = 2.0) -> None:
        self._server = server
        self._timeout = timeout
        self._context = ssl.create_default_context(cafile=str(layout.cert("ca")))
        self._context.load_cert_chain(str(layout.cert("admin")), str(layout.key("admin")))

    def get(self, path: str) -> Answer:
        request = urllib.request.Request(self._server + path)
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout, context=self._context
            ) as response:
                return Answer(response.status, response.read())
        except urllib.error.HTTPError as e:
            return Answer(e.code, e.read())
        except (OSError, ValueError):
            return Answer(0, b"")

    def _json(self, path: str) -> dict[str, Any] | None:
        answer = self.get(path)
        if answer.status != 200:
            return None
        data: dict[str, Any] = json.loads(answer.body)
        return data

    def ready(self) -> bool:
        """`/readyz`: storage, RBAC bootstrap and every post-start hook are done."""
        return self.get("/readyz").status == 200

    def node_ready(self, name: str) -> bool:
        node = self._json(f"/api/v1/nodes/{name}")
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def service_account_exists(self, namespace: str, name: str) -> bool:
        """The service-account controller of the controller manager has run."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        return self.get(path).status == 200


def serving_healthy(port: int, timeout: float = 2.0) -> bool:
    """`/healthz` of the controller manager or the scheduler on 127.0.0.1:`port`.

    Their serving certificates are self-signed at start, so only the answer counts here,
    not who gave it (the port is on loopback and was chosen by `up`).
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", timeout=timeout, context=context
        ) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False
