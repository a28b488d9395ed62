"""kubecore's clients against the real API server: each caller owns the client it connects.

A test runs a program (the reconciler) in the test's own event loop beside the test's own
client, both for one kubeconfig. kr8s hands such callers one shared client; the program's
close at its stop then closed the HTTP session under the test's requests in flight, and
their next calls raced to open a new one (the loser's connections left to the garbage
collector, which the integration tier reports as a ResourceWarning).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from e2e.local.fixtures import Kubectl
from kubecore import client

pytestmark = pytest.mark.integration


async def test_closing_one_client_leaves_a_watch_of_another_on_the_same_kubeconfig_alone(
    kubeconfig: Path, kubectl: Kubectl, namespace: str
) -> None:
    program = await client.connect(str(kubeconfig))
    test = await client.connect(str(kubeconfig))
    try:
        assert program is not test
        async with test.call_api("GET", version="v1", base="/api", namespace=namespace,
                                 url="configmaps",
                                 params={"watch": "true", "fieldSelector": "metadata.name=after"},
                                 stream=True) as response:
            lines = response.aiter_lines()
            await client.close(program)
            kubectl("create", "configmap", "after", "-n", namespace)
            event = await asyncio.wait_for(anext(lines), 30.0)
        assert '"name":"after"' in event
    finally:
        await client.close(program)
        await client.close(test)
