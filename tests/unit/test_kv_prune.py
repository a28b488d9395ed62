"""Which slot files the reconciler has a persisted member's kv-files container remove
(reconciler/kv_prune.py), on the unit shell's controller: after a restore the member's
own; while members run, those of every owner that is no ModelServer on that claim any
more (a member deleted from a claim it shared), once per pod and set of owners; a
container not reached yet is asked again after a backoff."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest

from reconciler import kv_prune
from reconciler.kv_prune import files_address
from reconciler.kv_slots_io import Address, PruneReport
from reconciler.spec import ModelServerSpec
from reconciler.stores import SERVER, Key
from tests.unit.test_swap_shell import NS, FakeKube, controller, pod, queued, server

pytestmark = pytest.mark.unit


class FakeFiles:
    """The reconciler's slot-file adapter: records each prune, answers as told."""

    def __init__(self) -> None:
        self.prunes: list[tuple[Address, frozenset[str]]] = []
        self.error: str | None = None

    async def prune(self, address: Address, keep: Collection[str]) -> PruneReport:
        self.prunes.append((address, frozenset(keep)))
        return PruneReport(error=self.error)


def persisted(name: str, claim: str = "shared") -> dict[str, Any]:
    body = server(name)
    body["spec"]["kvCache"] = {"persist": True, "pvc": claim}
    return body


def with_files(p: dict[str, Any], uid: str) -> dict[str, Any]:
    p["metadata"]["uid"] = uid
    p["spec"]["containers"] = [
        {"name": "server", "ports": [{"name": "http", "containerPort": 8080}]},
        {"name": "kv-files", "ports": [{"name": "kv-files", "containerPort": 8091}]}]
    return p


def shell(*bodies: dict[str, Any]) -> tuple[Any, FakeFiles]:
    c = controller(FakeKube(), [with_files(pod("a"), "pod-a")])
    for body in bodies:
        c.servers.cache[(NS, body["metadata"]["name"])] = body
    for claim in ("shared", "other"):
        c.ctx.stores.volume_claims.cache[(NS, claim)] = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"namespace": NS, "name": claim}}
    files = FakeFiles()
    c.ctx.slot_files = files  # type: ignore[assignment]
    return c, files


def spec_of(c: Any, name: str) -> ModelServerSpec:
    return ModelServerSpec.from_body(c.servers.cache[(NS, name)])


def test_the_owners_kept_are_the_servers_on_that_claim_and_those_unreadable() -> None:
    broken = server("broken")
    broken["spec"]["replicas"] = "many"
    c, _ = shell(persisted("a"), persisted("c", claim="other"), broken)
    # b: not persisted (the shell's own), c: another claim
    assert c.server_reconciler.kv_prune.keep(NS, "shared") == {
        "a-uid", "broken-uid"}
    c.servers.cache[(NS, "b")] = persisted("b")
    assert c.server_reconciler.kv_prune.keep(NS, "shared") == {"a-uid", "b-uid", "broken-uid"}


def test_a_pods_kv_files_address_is_its_ip_and_the_named_port() -> None:
    assert files_address(with_files(pod("a"), "u")) == ("127.1.0.9", 8091)
    assert files_address(pod("a")) is None  # no such container
    assert files_address(with_files(pod("a", ready=False), "u")) is None  # may not listen yet
    deleted = with_files(pod("a"), "u")
    deleted["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    assert files_address(deleted) is None


async def test_a_running_member_prunes_once_per_pod_and_again_when_an_owner_is_gone() -> None:
    c, files = shell(persisted("a"), persisted("b"))
    prune = c.server_reconciler.kv_prune
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert files.prunes == [(("127.1.0.9", 8091), frozenset({"a-uid", "b-uid"}))]
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert len(files.prunes) == 1  # nothing changed: not asked again
    # b is deleted from git: the persisted members that run are woken, a prunes b's files
    del c.servers.cache[(NS, "b")]
    queued(c)
    await c.server_reconciler.reconcile(Key(SERVER, NS, "b"))
    assert Key(SERVER, NS, "a") in queued(c)
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert files.prunes[-1] == (("127.1.0.9", 8091), frozenset({"a-uid"}))
    assert prune._done == {(NS, "a"): {"pod-a": frozenset({"a-uid"})}}
    c.ctx.background.cancel()


async def test_a_member_not_persisted_scans_nothing_and_prunes_nothing() -> None:
    c, files = shell()
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert files.prunes == []


async def test_a_prune_not_made_is_asked_again_after_a_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_prune, "RETRY_SECONDS", (0.0,))
    c, files = shell(persisted("a"))
    files.error = "http://127.1.0.9:8091/prune: ClientConnectorError"
    queued(c)
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert Key(SERVER, NS, "a") in queued(c)
    files.error = None
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert len(files.prunes) == 2  # asked again, since the first was not made
    c.ctx.background.cancel()


def logger_of(c: Any, name: str) -> Any:
    return c.ctx.writer.logger(c.servers.cache[(NS, name)], kv_prune.log)


async def test_after_a_restore_the_members_own_files_go() -> None:
    c, files = shell(persisted("a"), persisted("b"))
    prune = c.server_reconciler.kv_prune
    await prune.after_restore(spec_of(c, "a"), "pod-a", ("127.1.0.9", 8091), logger_of(c, "a"))
    assert files.prunes == [(("127.1.0.9", 8091), frozenset({"b-uid"}))]
    assert not prune.owed(NS, "a")  # made: a later prune keeps them again
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert files.prunes[-1] == (("127.1.0.9", 8091), frozenset({"a-uid", "b-uid"}))


async def test_a_restores_removal_not_made_is_owed_until_a_prune_through_the_pod_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kv-files container does not listen yet when the restore ends: the removal of the
    # member's own files is asked again, and every prune of it leaves them out until made.
    monkeypatch.setattr(kv_prune, "RETRY_SECONDS", (0.0,))
    c, files = shell(persisted("a"), persisted("b"))
    prune = c.server_reconciler.kv_prune
    files.error = "http://127.1.0.9:8091/prune: ClientConnectorError"
    queued(c)
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))  # the pod's own prune, refused
    await prune.after_restore(spec_of(c, "a"), "pod-a", ("127.1.0.9", 8091), logger_of(c, "a"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert prune.owed(NS, "a") and Key(SERVER, NS, "a") in queued(c)
    files.error = None
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))
    await asyncio.sleep(0)
    assert files.prunes[-1] == (("127.1.0.9", 8091), frozenset({"b-uid"}))
    assert not prune.owed(NS, "a")
    c.ctx.background.cancel()


async def test_a_restores_removal_asked_while_another_prune_runs_is_made_after_it() -> None:
    c, files = shell(persisted("a"), persisted("b"))
    prune = c.server_reconciler.kv_prune
    answered = asyncio.Event()
    asked = files.prune

    async def slow(address: Address, keep: Collection[str]) -> PruneReport:
        if not files.prunes:
            await answered.wait()
        return await asked(address, keep)

    files.prune = slow  # type: ignore[method-assign]
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))  # the pod's own prune, in flight
    await asyncio.sleep(0)
    restore = asyncio.create_task(prune.after_restore(
        spec_of(c, "a"), "pod-a", ("127.1.0.9", 8091), logger_of(c, "a")))
    await asyncio.sleep(0)
    answered.set()
    await restore
    assert files.prunes[-1] == (("127.1.0.9", 8091), frozenset({"b-uid"}))
    c.ctx.background.cancel()


async def test_a_restore_that_finds_no_ready_pod_owes_the_removal_to_its_first() -> None:
    c, files = shell(persisted("a"))
    prune = c.server_reconciler.kv_prune
    await prune.after_restore(spec_of(c, "a"), "pod-a", None, logger_of(c, "a"))
    assert files.prunes == [] and prune.owed(NS, "a")
    await c.server_reconciler.reconcile(Key(SERVER, NS, "a"))  # the pod is Ready
    await asyncio.sleep(0)
    assert files.prunes == [(("127.1.0.9", 8091), frozenset())]


async def test_a_save_cancels_what_a_restore_owed_and_is_never_pruned_while_it_writes() -> None:
    c, files = shell(persisted("a"))
    prune = c.server_reconciler.kv_prune
    await prune.after_restore(spec_of(c, "a"), "pod-a", None, logger_of(c, "a"))
    async with prune.saving(NS, "a"):
        # a prune that would remove the member's own files waits for the save...
        reconciled = asyncio.create_task(c.server_reconciler.reconcile(Key(SERVER, NS, "a")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert files.prunes == []
        # ...and a restore's removal asked for meanwhile is no debt of the new files
        await prune.after_restore(spec_of(c, "a"), "pod-a", ("127.1.0.9", 8091),
                                  logger_of(c, "a"))
    await reconciled
    for _ in range(5):
        await asyncio.sleep(0)
    assert files.prunes and all("a-uid" in keep for _, keep in files.prunes), files.prunes
    assert not prune.owed(NS, "a")
    c.ctx.background.cancel()
