"""The reconciler's metrics and health server, as a scraper and the kubelet see it: its
own families on /metrics (never the default registry's process and GC collectors, the
seeds' metrics bug), /healthz at once, /readyz only once its caches are synced. The API
server is out of reach here, which the reconciler waits out while it serves them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.__main__ import run
from reconciler.settings import Settings

pytestmark = pytest.mark.functional

RECONCILER_FAMILIES = {
    "modelpool_resident",
    "modelpool_swaps",
    "modelpool_swap_duration_seconds",
    "modelpool_swap_phase_duration_seconds",
    "modelpool_swap_failures",
    "modelpool_swap_deferrals",
    "modelpool_reconcile",
    "modelpool_reconcile_duration_seconds",
    "modelpool_reconciler_api_writes",
    "modelpool_reconciler_queue_depth",
    "modelpool_reconciler_leader",
}

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: t}}
contexts:
- name: gone
  context: {{cluster: gone, user: u}}
current-context: gone
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def reconciler(tmp_path: Path) -> AsyncIterator[str]:
    """A reconciler whose API server does not answer; its metrics base URL."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(port=free_port()))
    port = free_port()
    settings = Settings(namespace="ns", kubeconfig=str(kubeconfig), bind_host="127.0.0.1",
                        metrics_port=port)
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, None, stop, handle_signals=False))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                assert not task.done(), task.result()
                try:
                    async with http.get(base + "/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)  # the server's socket is not bound yet
        yield base
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)  # a stop while it waits for the API server ends it


async def test_metrics_are_the_reconcilers_own_families(reconciler: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(reconciler + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert families >= RECONCILER_FAMILIES, RECONCILER_FAMILIES - families
    assert {f for f in families if not f.startswith("modelpool_")} == set()


async def test_not_ready_before_its_caches_are_synced(reconciler: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(reconciler + "/healthz") as r:
            assert r.status == 200
        async with http.get(reconciler + "/readyz") as r:
            assert r.status == 503
