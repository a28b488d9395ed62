"""kubecore's list-then-watch against the real API server: a watch from a version the
server no longer keeps is answered 410 Gone, and the reconciler's and the router's kube
modules list again at once (a new version, no failure waited out) and go on to deliver
the next change.

A list "read" at resourceVersion 1 stands for one read long ago. The API server serves a
watch of a kind from the history its watch cache keeps, which for a custom resource
starts where its definition was established, well after version 1: the watch from it is
the one a program resumes after a long disconnection, and is answered with an ERROR event
of code 410. (Core kinds are cached from the server's start, near version 1 on a fresh
cluster, so they would not show it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import kr8s.asyncio
import pytest

from e2e.harness import wait_established
from e2e.local.fixtures import Kubectl
from reconciler import kube as reconciler_kube
from sidecar.kube import KubeClient
from sidecar.kube_port import Changed, Listed

pytestmark = pytest.mark.integration

TOO_OLD = "1"
Json = dict[str, Any]
CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "modelpool.dev_modelpools.yaml"


@pytest.fixture
def pools(kubectl: Kubectl, namespace: str) -> Kubectl:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_established(kubectl, ["modelpools.modelpool.dev"])
    create_pool(kubectl, namespace, "before")
    return kubectl


def create_pool(kubectl: Kubectl, namespace: str, name: str) -> None:
    body = {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"members": [{"name": "coder"}]}}
    kubectl("create", "-f", "-", input=json.dumps(body))


def no_failures(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == logger and r.levelno >= logging.WARNING]


def expired(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == logger and "410 Gone" in r.getMessage()]


async def test_the_reconcilers_informer_lists_again_after_a_watch_from_a_forgotten_version(
    api: kr8s.asyncio.Api, pools: Kubectl, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reconciler.kube")

    class ReadLongAgo(reconciler_kube.Kube):
        def __init__(self, api: Any) -> None:
            super().__init__(api)
            self.lists: list[str] = []
            self.listed_again = asyncio.Event()

        async def list_all(
            self, resource: Any, ns: Any, label_selector: Any = None
        ) -> tuple[list[Json], str]:
            items, version = await super().list_all(resource, ns, label_selector)
            self.lists.append(version)
            if len(self.lists) == 1:
                return items, TOO_OLD
            self.listed_again.set()
            return items, version

    kube = ReadLongAgo(api)
    changes: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    informer = reconciler_kube.Informer(
        kube, reconciler_kube.MODEL_POOLS, namespace,
        lambda type_, obj: changes.put_nowait((type_, obj["metadata"]["name"])),
    )
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(30):
            await kube.listed_again.wait()  # the watch from version 1 is answered 410
            create_pool(pools, namespace, "after")
            while await changes.get() != ("ADDED", "after"):
                pass
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert informer.get(namespace, "after") is not None
    assert expired(caplog, "reconciler.kube") != []
    assert no_failures(caplog, "reconciler.kube") == []


async def test_the_routers_watch_lists_again_after_a_watch_from_a_forgotten_version(
    api: kr8s.asyncio.Api, pools: Kubectl, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.kube")

    class ReadLongAgo(KubeClient):
        lists = 0

        async def _list(self, *args: Any, **kwargs: Any) -> tuple[list[Json], str]:
            items, version = await super()._list(*args, **kwargs)
            self.lists += 1
            return items, TOO_OLD if self.lists == 1 else version

    client = ReadLongAgo(api)
    events = client.watch_pools(namespace)
    assert isinstance(events, AsyncGenerator)
    async with contextlib.aclosing(events):
        async with asyncio.timeout(30):
            assert isinstance(await anext(events), Listed)  # the list read long ago
            relisted = await anext(events)  # the watch from version 1 is answered 410
        assert isinstance(relisted, Listed) and client.lists == 2
        changed = asyncio.ensure_future(anext(events))
        create_pool(pools, namespace, "after")
        async with asyncio.timeout(30):
            after = await changed
        assert isinstance(after, Changed) and after.item.name == "after"
    assert expired(caplog, "sidecar.kube") != []
    assert no_failures(caplog, "sidecar.kube") == []
