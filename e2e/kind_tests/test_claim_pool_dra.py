"""A budgeted pool that shares one device through the ResourceClaim it owns, on the DRA
kind cluster (e2e/kind/up-dra.sh: the fake GPUs' DRA driver, two devices of 1024 MiB, and
modelpool installed): the reconciler renders the claim, the scheduler allocates one device,
the budget is that device's published memory, and every member pod references the claim.
Three fake members of 512, 448 and 512 MiB (any two fit, three do not), driven through the
router with the `openai` SDK: two are served side by side, the third evicts the one used
least recently, and the device's memory ledger, which the members charge as they load,
never holds more than 1024 MiB nor a charge on the other device.

Collected only with `MODELPOOL_KIND_DRA=1` (e2e/kind_tests/conftest.py), like the driver's
own tests:

    MODELPOOL_KIND_KUBECONFIG=$(e2e/kind/up-dra.sh | tail -n 1) MODELPOOL_KIND_DRA=1 \\
      .venv/bin/pytest e2e/kind_tests/test_claim_pool_dra.py
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.fake_model.gpu_ledger import live_charges
from e2e.kind_tests.test_dra_driver import DRIVER, MIB, gpu_node, ledger_dir, node_name
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

__all__ = ["gpu_node"]  # the fixture, shared with the driver's tests

POOL, ROUTER = "shared", "chat"
FOOTPRINTS_MIB = {"a": 512, "b": 448, "c": 512}
ASK: Any = [{"role": "user", "content": "the pool"}]


def member(name: str) -> harness.Json:
    server = harness.fake_member(name, load_time=0.5, scratch=False)
    server["spec"]["resources"] = {"gpu": 0}  # the claim is the device, not a whole GPU each
    return server


def charged(node: str) -> dict[str, int]:
    """Bytes charged to each of the node's two devices."""
    directory = ledger_dir(node)
    return {index: sum(c.bytes for c in live_charges(directory, index)) for index in ("0", "1")}


def residents(kubectl: Kubectl, ns: str) -> set[str] | None:
    status = harness.pool_status(kubectl, ns, POOL)
    if status.get("phase") != "Ready":
        return None
    return {r["name"] for r in status.get("residents") or []}


async def until_residents(kubectl: Kubectl, ns: str, wanted: set[str]) -> harness.Json:
    await asyncio.to_thread(harness.eventually, lambda: residents(kubectl, ns) == wanted or None,
                            f"residents {sorted(wanted)}", 120.0)
    return harness.pool_status(kubectl, ns, POOL)


async def test_a_claim_pool_shares_one_allocated_device_within_its_memory(
    kind_kubectl: Kubectl, restricted_namespace: str, gpu_node: dict[str, Any],
) -> None:
    ns, kubectl, node = restricted_namespace, kind_kubectl, node_name(gpu_node)
    pool = harness.pool(POOL, list(FOOTPRINTS_MIB), default="a", swap_budget="120s",
                        device={"claim": {"deviceClassName": DRIVER}})
    for entry in pool["spec"]["members"]:
        entry["gpuMemory"] = f"{FOOTPRINTS_MIB[entry['name']]}Mi"
    with harness.sampled(lambda: charged(node), "the devices' ledgers", 0.1) as charges:
        harness.apply(kubectl, ns, *(member(m) for m in FOOTPRINTS_MIB), pool,
                      harness.router_on_node(harness.router(ROUTER, list(FOOTPRINTS_MIB)),
                                             node))
        (router,) = await asyncio.to_thread(harness.wait_router_ready, kubectl, ns, ROUTER,
                                            None, 180.0)
        status = await until_residents(kubectl, ns, {"a"})
        device = status["device"]
        assert device["memory"] == device["budget"] == 1024 * MIB, device
        claim = kubectl.json("get", "resourceclaim", device["claim"], "-n", ns)
        (allocated,) = claim["status"]["allocation"]["devices"]["results"]
        assert allocated["driver"] == DRIVER, allocated
        client = openai.AsyncOpenAI(base_url=harness.base_url(router), api_key="unused",
                                    max_retries=0, timeout=120)
        try:
            await client.chat.completions.create(model="b", messages=ASK, max_tokens=2)
            status = await until_residents(kubectl, ns, {"a", "b"})
            assert status["lastSwap"]["evicted"] == [], status["lastSwap"]
            await client.chat.completions.create(model="a", messages=ASK, max_tokens=2)
            await client.chat.completions.create(model="b", messages=ASK, max_tokens=2)
            await client.chat.completions.create(model="c", messages=ASK, max_tokens=2)
            status = await until_residents(kubectl, ns, {"b", "c"})
            assert status["lastSwap"]["evicted"] == ["a"], status["lastSwap"]
        finally:
            await client.close()
        for pod in kubectl.json("get", "pods", "-n", ns, "-l",
                                f"modelpool.dev/pool={POOL}")["items"]:
            claims = pod["spec"].get("resourceClaims") or []
            assert [c.get("resourceClaimName") for c in claims] == [device["claim"]], pod
    used = {index for sample in charges for index, charged in sample.items() if charged}
    assert len(used) == 1, f"charges on more than one device: {used}"
    peak = max(sum(sample.values()) for sample in charges)
    assert peak == (512 + 512) * MIB or peak == (512 + 448) * MIB, peak
    assert all(sum(sample.values()) <= 1024 * MIB for sample in charges)
