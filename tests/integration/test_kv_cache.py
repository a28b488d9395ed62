"""A member's conversations kept across a swap, on the real API server of the local
cluster: the reconciler in-process, the router and the members run by the node agent (the
members as the fake model server, whose slots cache their prompts and save and restore
them as llama-server does). A conversation on a persisted member, a swap to the other
member and back through the router, and the next turn finds its context in the slot's
cache (`timings.cache_n`); without persist, or with a manifest made for another context
size, it does not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e import harness
from e2e.fake_model.app import CONTEXT_SIZE
from reconciler import kv_slots_io
from tests.integration import test_reconciler as base
from tests.integration.test_reconciler import (
    Json,
    Running,
    apply,
    condition_when,
    event_seen,
    eventually,
    pool,
    ready_with,
    router,
    server,
)

pytestmark = pytest.mark.integration

CLAIM = "kv"
FIRST = ("You are a careful assistant. Read the following notes about the garden and "
         "answer briefly. " + " ".join(f"note{i} the roses need water" for i in range(40)))


# test_reconciler's fixtures: its API server's CRDs, the reconciler in-process
crds = base.crds
running = base.reconciler


def persisted(name: str, *, args: tuple[str, ...] = (), claim: str = CLAIM) -> Json:
    body = server(name)
    body["spec"]["kvCache"] = {"persist": True, "pvc": claim, "saveTimeout": "5s"}
    body["spec"]["args"] = [*body["spec"]["args"], *args]
    return body


@pytest.fixture
def kv_claim(kubectl: Any, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """The claim `kv`, bound to a volume on the node's directory (returned)."""
    node = kubectl.json("get", "nodes")["items"][0]["metadata"]["name"]
    directory = tmp_path / "kv"
    directory.mkdir()
    pv, pvc = harness.node_volume(namespace, CLAIM, node, str(directory))
    for body in (pv, pvc):
        body["spec"]["accessModes"] = ["ReadWriteOnce"]
    # the testbed runs no volume binder: the claim comes bound, as the binder leaves it
    pvc["metadata"]["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
    harness.apply(kubectl, namespace, pv, pvc)
    try:
        yield directory
    finally:
        kubectl("delete", "persistentvolume", pv["metadata"]["name"], "--wait=false")


async def router_url(kubectl: Any, namespace: str) -> str:
    async def ready() -> str | None:
        pods = await asyncio.to_thread(harness.router_pods, kubectl, namespace, "chat")
        up = [p for p in pods if p.ready and not p.terminating and p.ip]
        return harness.base_url(up[0]) if up else None

    return await eventually(ready, "the router's pod to be Ready", 90)


async def chat(session: aiohttp.ClientSession, base: str, model: str,
               messages: list[Json]) -> Json:
    async with session.post(f"{base}/chat/completions",
                            json={"model": model, "max_tokens": 4, "messages": messages},
                            timeout=aiohttp.ClientTimeout(total=120)) as response:
        body: Json = await response.json()
        assert response.status == 200, body
        return body


async def swap_away_and_back(running: Running, kubectl: Any, namespace: str
                             ) -> tuple[Json, Json]:
    """A conversation on `a`, a request for `b`, then the conversation's next turn on `a`,
    all through the router: the first turn's reply and the next turn's."""
    base = await router_url(kubectl, namespace)
    first = [{"role": "user", "content": FIRST}]
    async with aiohttp.ClientSession() as session:
        turn = await chat(session, base, "a", first)
        await chat(session, base, "b", [{"role": "user", "content": "hello"}])
        answer = turn["choices"][0]["message"]["content"]
        follow = [*first, {"role": "assistant", "content": answer},
                  {"role": "user", "content": "and the tulips?"}]
        return turn, await chat(session, base, "a", follow)


async def test_a_persisted_members_slot_comes_back_after_a_swap_away_and_back(
    running: Running, kubectl: Any, namespace: str, kv_claim: Path
) -> None:
    # left by an earlier member named a (removed before a's process starts), and by a
    # member that is no ModelServer any more (removed by a's kv-files once a runs)
    (kv_claim / "a-99999999-deadbeef-slot0.bin").write_bytes(b"old")
    (kv_claim / "other-99999999-deadbeef-slot0.bin").write_bytes(b"not a's")
    apply(kubectl, namespace, persisted("a"), server("b"), pool(["a", "b"]),
          router(["a", "b"]))
    await ready_with(running, "a")
    await eventually(lambda: claim_holds(kv_claim, []), "the claim emptied", 30)
    first, follow = await swap_away_and_back(running, kubectl, namespace)
    context = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert follow["timings"]["cache_n"] >= context, follow["timings"]

    body = await running.pool()
    last = body["status"]["lastSwap"]
    assert (last["from"], last["to"], last["outcome"]) == ("b", "a", "Succeeded")
    assert [p["name"] for p in last["phases"]][-1] == "restore"
    for phase in ("save", "restore"):
        assert running.sample("modelpool_swap_phase_duration_seconds_count", pool="slot",
                                 phase=phase) >= 1, phase
    assert running.sample("modelpool_kv_slots_total", member="a", kind="save",
                             outcome="saved") >= 1
    assert running.sample("modelpool_kv_slots_total", member="a", kind="restore",
                             outcome="restored") >= 1
    member = await running.get("modelservers", "a")
    assert "kvCache" not in (member.get("status") or {})  # consumed by the restore
    # ...and the files it named removed with it
    await eventually(lambda: claim_holds(kv_claim, []), "a's restored files removed", 30)


async def claim_holds(directory: Path, names: list[str]) -> bool | None:
    """True once `directory` holds exactly `names` (None until then)."""
    found = await asyncio.to_thread(lambda: sorted(p.name for p in directory.iterdir()))
    return True if found == sorted(names) else None


async def test_a_member_deleted_from_a_shared_claim_has_its_files_removed(
    running: Running, kubectl: Any, namespace: str, kv_claim: Path
) -> None:
    kept, gone = persisted("keeps"), persisted("gone")
    kept["spec"]["replicas"] = 1
    gone["spec"]["replicas"] = 0
    apply(kubectl, namespace, kept, gone)
    uids = {n: (await running.get("modelservers", n))["metadata"]["uid"].split("-")[0]
            for n in ("keeps", "gone")}
    mine = f"keeps-{uids['keeps']}-deadbeef-slot0.bin"
    theirs = f"gone-{uids['gone']}-deadbeef-slot1.bin"
    stray = "stray-00000000-deadbeef-slot0.bin"  # of no ModelServer
    for name in (mine, theirs, stray):
        (kv_claim / name).write_bytes(b"a saved slot")

    async def serving() -> bool | None:
        body = await running.get("modelservers", "keeps")
        return True if (body.get("status") or {}).get("phase") == "Ready" else None

    await eventually(serving, "keeps Ready", 90)
    # keeps's pod pruned once: the stray file went, both ModelServers' files stayed
    await eventually(lambda: claim_holds(kv_claim, [mine, theirs]), "the stray file removed",
                     60)
    kubectl("delete", "modelserver", "gone", "-n", namespace)
    await eventually(lambda: claim_holds(kv_claim, [mine]), "gone's files removed", 60)


async def test_without_persist_the_next_turn_reads_its_context_again(
    running: Running, kubectl: Any, namespace: str
) -> None:
    apply(kubectl, namespace, server("a"), server("b"), pool(["a", "b"]), router(["a", "b"]))
    await ready_with(running, "a")
    _, follow = await swap_away_and_back(running, kubectl, namespace)
    assert follow["timings"]["cache_n"] == 0, follow["timings"]
    last = (await running.pool())["status"]["lastSwap"]
    assert "restore" not in [p["name"] for p in last["phases"]]
    assert running.sample("modelpool_swap_phase_duration_seconds_count", pool="slot",
                             phase="save") == 0


async def test_a_manifest_made_for_another_context_size_is_not_restored(
    running: Running, kubectl: Any, namespace: str, kv_claim: Path
) -> None:
    apply(kubectl, namespace, persisted("a"), server("b"), pool(["a", "b"]),
          router(["a", "b"]))
    await ready_with(running, "a")
    base = await router_url(kubectl, namespace)
    first = [{"role": "user", "content": FIRST}]
    async with aiohttp.ClientSession() as session:
        await chat(session, base, "a", first)
        await chat(session, base, "b", [{"role": "user", "content": "hello"}])

        async def saved() -> Json | None:
            member = await running.get("modelservers", "a")
            return (member.get("status") or {}).get("kvCache")

        manifest = await eventually(saved, "a's manifest in status", 30)
        assert manifest["slots"] and manifest["identity"]["n_ctx"] > 0
        # a's context changes while it is unloaded: its saved slots no longer fit
        apply(kubectl, namespace, persisted("a", args=("--ctx-size", "2048")))
        follow = await chat(session, base, "a", [*first, {"role": "user", "content": "and?"}])
    assert follow["timings"]["cache_n"] == 0, follow["timings"]
    assert running.sample("modelpool_kv_slots_total", member="a", kind="restore",
                             outcome="discarded") == 1
    assert running.sample("modelpool_kv_slots_total", member="a", kind="restore",
                             outcome="restored") == 0
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    discarded = [e["message"] for e in events if e.get("reason") == "KvCacheDiscarded"]
    assert discarded and "another n_ctx" in discarded[0], discarded


async def test_a_save_that_fails_is_told_and_the_swap_goes_on(
    running: Running, kubectl: Any, namespace: str, kv_claim: Path
) -> None:
    apply(kubectl, namespace, persisted("a"), server("b"), pool(["a", "b"]),
          router(["a", "b"]))
    await ready_with(running, "a")
    # as a full disk would: every slot file of a's cannot be written (a directory has
    # its name)
    uid = (await running.get("modelservers", "a"))["metadata"]["uid"]
    identity = kv_slots_io.identity_of(
        kv_slots_io.IdentityArgs("/models/a.gguf", ("--mode", "llamacpp")), CONTEXT_SIZE)
    for slot in range(8):
        (kv_claim / kv_slots_io.slot_file("a", uid, identity, slot)).mkdir()
    _, follow = await swap_away_and_back(running, kubectl, namespace)
    assert follow["timings"]["cache_n"] == 0
    await event_seen(kubectl, namespace, "a", "KvSaveFailed")
    assert running.sample("modelpool_kv_slots_total", member="a", kind="save",
                          outcome="failed") >= 1
    member = await running.get("modelservers", "a")
    assert "kvCache" not in (member.get("status") or {})  # no manifest names a failed save


async def test_a_member_whose_claim_does_not_exist_is_stalled_until_it_does(
    running: Running, kubectl: Any, namespace: str
) -> None:
    body = persisted("a", claim="nowhere")
    body["spec"]["replicas"] = 0
    apply(kubectl, namespace, body)
    stalled = await condition_when(
        running, "modelservers", "a", "Stalled", lambda c: c["status"] == "True",
        "a Stalled for its claim")
    assert stalled["reason"] == "KvCacheClaimNotFound"
    assert "nowhere" in stalled["message"]
    assert kubectl.json("get", "deployments", "-n", namespace)["items"] == []
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                               "metadata": {"name": "nowhere"},
                               "spec": {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": "1Gi"}}}})
    await condition_when(running, "modelservers", "a", "Stalled",
                         lambda c: c["status"] == "False", "a no longer Stalled")


async def test_a_storage_class_gets_a_claim_that_goes_with_its_server(
    running: Running, kubectl: Any, namespace: str
) -> None:
    body = server("a")
    body["spec"]["replicas"] = 0
    body["spec"]["kvCache"] = {"persist": True, "storageClassName": "standard",
                               "storageSize": "2Gi"}
    apply(kubectl, namespace, body)

    async def created() -> Json | None:
        found = kubectl.json("get", "persistentvolumeclaims", "-n", namespace)["items"]
        return found[0] if found else None

    made = await eventually(created, "the claim of a's saved slots", 30)
    uid = (await running.get("modelservers", "a"))["metadata"]["uid"]
    assert made["metadata"]["name"] == "a-kv-cache"
    assert [o["uid"] for o in made["metadata"]["ownerReferences"]] == [uid]
    assert made["spec"]["storageClassName"] == "standard"
    assert made["spec"]["resources"]["requests"]["storage"] == "2Gi"
    deployment = kubectl.json("get", "deployment", "a", "-n", namespace)
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "kv-cache", "persistentVolumeClaim": {"claimName": "a-kv-cache"}} in volumes
    kubectl("delete", "modelserver", "a", "-n", namespace)

    async def collected() -> bool | None:
        found = kubectl.json("get", "persistentvolumeclaims", "-n", namespace)["items"]
        return True if not found or all(
            c["metadata"].get("deletionTimestamp") for c in found) else None

    await eventually(collected, "the claim collected with its server", 60)
