"""The router's Kubernetes Events on the testbed, as a person watching the pool sees them.

modelpool is installed with its reconciler in a pod scoped to the test's namespace
(e2e/harness.py); two fake members `a` and `b` share the pool `slot` (default `a`) behind
the router `chat`. The router pod runs with its own ServiceAccount token (the node agent
writes it a kubeconfig), so the Events below were created under the router's Role: each
names the router pod as `reportingInstance`, and the same token is shown to be allowed
to create Events and nothing more about them.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from e2e import harness, testbeds
from e2e.harness import Installation, Json, Pod
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.e2e

POOL = "slot"
ROUTER = "chat"
REPORTER = "modelpool.dev/router"
MESSAGES: Any = [{"role": "user", "content": "Say something."}]


def bring_up(
    kubectl: Kubectl, namespace: str, *, b_load_time: float = 2.0, max_held: int | None = None
) -> Pod:
    """Members a and b, the pool (default a) and the router; returns the router pod once a
    serves."""
    harness.apply(
        kubectl,
        namespace,
        harness.fake_member("a", load_time=2.0),
        harness.fake_member("b", load_time=b_load_time),
        harness.pool(POOL, ["a", "b"], default="a", swap_budget="60s"),
        harness.router(ROUTER, ["a", "b"], max_held_requests=max_held),
    )
    harness.wait_pool_ready(kubectl, namespace, POOL, resident="a", within=60)
    (router,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=60)
    return router


def router_events(kubectl: Kubectl, namespace: str, reason: str) -> list[Json]:
    """The Events on the pool with this reason that a router reported, by field selector as
    a person would ask for them."""
    items: list[Json] = kubectl.json(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={POOL},reason={reason}",
    )["items"]
    return [e for e in items if e.get("reportingComponent") == REPORTER]


def chat(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    assert reply.model == model
    return reply.choices[0].message.content or ""


def test_a_cross_model_request_posts_swap_requested_on_the_pool(
    kubectl: Kubectl, namespace: str, installed: Installation, testbed: testbeds.Testbed,
    tmp_path: Path,
) -> None:
    router = bring_up(kubectl, namespace)
    assert router_events(kubectl, namespace, "SwapRequested") == []
    with openai.OpenAI(
        base_url=harness.base_url(router), api_key="unused", max_retries=0, timeout=60
    ) as client:
        assert chat(client, "b")
    harness.wait_pool_ready(kubectl, namespace, POOL, resident="b", within=30)

    (event,) = harness.eventually(
        lambda: router_events(kubectl, namespace, "SwapRequested") or None,
        "a SwapRequested Event from the router",
        within=20,
    )
    assert event["type"] == "Normal"
    assert event["message"] == "router chat asked for b (resident a, 1 request held)"
    assert event["reportingInstance"] == router.name
    assert event["source"]["component"] == REPORTER
    pool = harness.get(kubectl, namespace, "modelpools.modelpool.dev", POOL)
    involved = event["involvedObject"]
    assert (involved["kind"], involved["name"], involved["uid"]) == (
        "ModelPool",
        POOL,
        pool["metadata"]["uid"],
    )
    # `kubectl describe` finds a pool's Events by its uid: the router's is among them.
    described = kubectl("describe", "modelpool", POOL, "-n", namespace).stdout
    assert "SwapRequested" in described
    assert "router chat asked for b" in described

    # Posted under the router's own token: it may create and patch Events, and no more.
    config = testbed.pod_kubeconfig(router, tmp_path)

    def can_i(*args: str) -> str:
        return run_kubectl(kubectl.binary, config, "-n", namespace, "auth", "can-i", *args)

    assert can_i("create", "events") == "yes"
    assert can_i("patch", "events") == "yes"
    assert can_i("create", "events.events.k8s.io") == "yes"
    assert can_i("delete", "events") == "no"
    assert can_i("list", "events") == "no"
    assert can_i("update", "events") == "no"


def test_a_flood_of_rejections_makes_one_event(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    """maxHeldRequests 1 and a slow load of b: one request for b is held, the next ones are
    answered 503 at once, and the pool gets one HeldRequestsRejected Event for all of
    them (the rest are counted in a summary at most every 30 s)."""
    router = bring_up(kubectl, namespace, b_load_time=15.0, max_held=1)
    url = harness.base_url(router)
    held_reply: list[str] = []

    def hold() -> None:
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=90) as c:
            held_reply.append(chat(c, "b"))

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        harness.eventually(
            lambda: router_events(kubectl, namespace, "SwapRequested") or None,
            "the held request's SwapRequested Event",
            within=20,
        )
        rejected = 0
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=10) as c:
            for _ in range(20):
                with pytest.raises(openai.APIStatusError) as caught:
                    chat(c, "b")
                assert caught.value.status_code == 503
                rejected += 1
        assert rejected == 20
        (event,) = harness.eventually(
            lambda: router_events(kubectl, namespace, "HeldRequestsRejected") or None,
            "a HeldRequestsRejected Event from the router",
            within=10,
        )
        assert event["type"] == "Warning"
        assert event["message"] == (
            "router chat answered 1 request for b with 503: maxHeldRequests 1 reached"
        )
        assert event["reportingInstance"] == router.name
        assert event["count"] == 1
        # One Event for twenty rejections: the others wait for the window's summary.
        assert len(router_events(kubectl, namespace, "HeldRequestsRejected")) == 1
    finally:
        holder.join(timeout=90)
    assert held_reply, "the held request got no answer after the swap"


def run_kubectl(binary: str, kubeconfig: Path, *args: str) -> str:
    return subprocess.run(
        [binary, f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.strip()
