"""The reconciler's metrics and health server, as a scraper and the kubelet see it: its
own families on /metrics (never the default registry's process and GC collectors, the
seeds' metrics bug), /healthz at once, /readyz only once its caches are synced. The API
server is out of reach here, which the reconciler waits out while it serves them."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

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
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def reconciler(tmp_path: Path, registry: CollectorRegistry) -> AsyncIterator[str]:
    """A reconciler whose API server does not answer, on `registry`; its metrics base
    URL."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(port=free_port()))
    port = free_port()
    settings = Settings(namespace="ns", kubeconfig=str(kubeconfig), bind_host="127.0.0.1",
                        metrics_port=port)
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, registry, stop, handle_signals=False))
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


class _Gate(Collector):
    """A collector whose collection waits until the event loop lets it go: one the loop
    can let go only if it still runs while a scrape is collected."""

    def __init__(self) -> None:
        self.collecting = threading.Event()
        self.let_go = threading.Event()
        self.let_go_by_the_loop = False

    def collect(self) -> Iterator[Metric]:
        self.collecting.set()
        # Collected on the loop itself, nothing could let it go: the wait ends at its cap.
        self.let_go_by_the_loop = self.let_go.wait(timeout=10)
        return iter(())


async def test_a_scrape_never_stalls_the_event_loop(
        registry: CollectorRegistry, reconciler: str) -> None:
    """At hundreds of pools an exposition takes a sizeable fraction of a second of CPU: the
    reconciles, watches and Lease renewals on the loop go on meanwhile."""
    gate = _Gate()
    registry.register(gate)
    async with aiohttp.ClientSession() as http:

        async def scrape() -> str:
            async with http.get(reconciler + "/metrics") as r:
                assert r.status == 200
                return await r.text()

        scraped = asyncio.create_task(scrape())
        await asyncio.to_thread(gate.collecting.wait, 10)
        gate.let_go.set()
        text = await scraped
    assert gate.let_go_by_the_loop
    assert "modelpool_reconciler_leader" in text
