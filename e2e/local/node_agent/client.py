"""The testbed client: proves that a pod's process holds its own ServiceAccount's rights.

Run by the node agent for the test-only image `modelpool/testbed-client`:
`python -m e2e.local.node_agent.client VERB RESOURCE [NAME]` with VERB `list` or `get`,
in the namespace of its kubeconfig's context, with the credentials of `$KUBECONFIG`
(the token the agent requested for the pod). Prints `OK <count>` (list) or `OK <name>`
(get) and exits 0; prints `FORBIDDEN` or `NOTFOUND` or `ERROR <message>` and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from e2e.local.node_agent.kube import ApiError, Forbidden, Kube, NotFound

VERSIONS: Mapping[str, str] = {
    "pods": "v1",
    "secrets": "v1",
    "configmaps": "v1",
    "services": "v1",
    "serviceaccounts": "v1",
    "events": "v1",
    "deployments": "apps/v1",
    "replicasets": "apps/v1",
    "endpointslices": "discovery.k8s.io/v1",
    "leases": "coordination.k8s.io/v1",
    "modelservers": "modelpool.dev/v1alpha1",
    "modelpools": "modelpool.dev/v1alpha1",
    "modelrouters": "modelpool.dev/v1alpha1",
}


def resource_version(resource: str) -> tuple[str, str]:
    """`pods` -> (`v1`, `pods`); `widgets.example.com/v1` -> (`example.com/v1`, `widgets`)."""
    if resource in VERSIONS:
        return VERSIONS[resource], resource
    plural, _, version = resource.partition(".")
    if not version:
        raise ValueError(f"unknown resource {resource!r}: use plural.group/version")
    return version, plural


def context_namespace(config: Mapping[str, Any]) -> str:
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    context = contexts.get(config.get("current-context", ""), {})
    return str(context.get("namespace") or "default")


async def run(
    kubeconfig: str, namespace: str, verb: str, resource: str, name: str | None
) -> tuple[int, str]:
    version, plural = resource_version(resource)
    url = f"namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")
    try:
        kube = await Kube.connect(kubeconfig)
        result = await kube.request("GET", version, url)
    except Forbidden:
        return 1, "FORBIDDEN"
    except NotFound:
        return 1, "NOTFOUND"
    except ApiError as error:
        return 1, f"ERROR {error}"
    if verb == "list":
        return 0, f"OK {len(result.get('items') or [])}"
    return 0, f"OK {result['metadata']['name']}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m e2e.local.node_agent.client")
    parser.add_argument("verb", choices=["list", "get"])
    parser.add_argument("resource")
    parser.add_argument("name", nargs="?")
    args = parser.parse_args(argv)
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not kubeconfig:
        print("ERROR no KUBECONFIG: the pod has no service-account token", flush=True)
        sys.exit(1)
    namespace = context_namespace(yaml.safe_load(Path(kubeconfig).read_text()))
    code, outcome = asyncio.run(run(kubeconfig, namespace, args.verb, args.resource, args.name))
    print(outcome, flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
