"""Kubeconfig files for the local cluster's identities.

Certificates are embedded, so a kubeconfig is one self-contained file: it can be handed
to a test, to the node agent or to a person without the state directory's layout.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

CLUSTER_NAME = "modelpool-local"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def render(server: str, ca_pem: bytes, user: str, cert_pem: bytes, key_pem: bytes) -> str:
    """A kubeconfig with one cluster, one client-certificate user and one current context."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(cert_pem),
                    "client-key-data": _b64(key_pem),
                },
            }
        ],
        "contexts": [
            {
                "name": f"{user}@{CLUSTER_NAME}",
                "context": {"cluster": CLUSTER_NAME, "user": user, "namespace": "default"},
            }
        ],
        "current-context": f"{user}@{CLUSTER_NAME}",
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write(path: Path, text: str) -> None:
    """Write atomically (readers never see half a file), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(path)
