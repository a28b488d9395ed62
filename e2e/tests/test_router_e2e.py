"""The router end to end on the testbed (issue 4, "End to end on the testbed").

modelpool is installed from overlays/local with its reconciler in a pod (scoped to the
test's namespace, see e2e/harness.py); each test applies two fake members `a` and `b` in
a pool `slot` (default `a`) and a router `chat` in front of them, then talks to the
router pod's address with the official `openai` SDK, as a client in the cluster would.
Swaps are counted from the reconciler's own /metrics and the pool's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.metrics_core import Metric

from e2e import harness, testbeds
from e2e.harness import Installation, Json, Pod
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.e2e

POOL = "slot"
ROUTER = "chat"
MESSAGES: Any = [{"role": "user", "content": "Say something."}]
# Every family DESIGN.md "Metrics" lists for the router; the parser names a counter's
# family without `_total`.
ROUTER_FAMILIES = {
    "modelpool_held_requests": "gauge",
    "modelpool_hold_duration_seconds": "histogram",
    "modelpool_coalesced": "counter",
    "modelpool_requests": "counter",
    "modelpool_request_duration_seconds": "histogram",
    "modelpool_time_to_first_byte_seconds": "histogram",
    "modelpool_upstream_errors": "counter",
    "modelpool_errors": "counter",
}


@dataclass
class Stack:
    kubectl: Kubectl
    namespace: str
    installation: Installation
    router: Pod

    @property
    def base_url(self) -> str:
        return harness.base_url(self.router)

    def client(self, max_retries: int = 0, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key="unused", max_retries=max_retries, timeout=timeout
        )

    def pool(self) -> Json:
        return harness.pool_status(self.kubectl, self.namespace, POOL)

    def router_metrics(self, answered: int | None = None) -> dict[str, Metric]:
        """The router's /metrics; with `answered`, once it has counted that many requests
        (it records a request after the client has read the last byte of it)."""
        url = harness.metrics_url(self.router)
        if answered is None:
            return harness.scrape(url)

        def counted() -> dict[str, Metric] | None:
            families = harness.scrape(url)
            done = harness.sample_sum(families, "modelpool_requests_total")
            return families if done >= answered else None

        return harness.eventually(counted, f"the router counting {answered} requests", 10)

    def swaps(self, to: str) -> float:
        """Completed swaps to `to`, from the reconciler's /metrics."""
        pod = harness.reconciler_pod(self.kubectl, self.installation)
        families = harness.scrape(harness.metrics_url(pod))
        return harness.sample_sum(
            families, "modelpool_swaps_total", namespace=self.namespace, pool=POOL, to=to
        )


def bring_up(
    kubectl: Kubectl,
    namespace: str,
    installation: Installation,
    *,
    a: Json | None = None,
    b: Json | None = None,
    swap_budget: str = "60s",
    response_header_timeout: str = "600s",
    **pool_spec: Any,
) -> Stack:
    """Members a and b, the pool (default a, and `pool_spec`) and the router; returns once
    a serves."""
    harness.apply(
        kubectl,
        namespace,
        a or harness.fake_member("a", load_time=2.0),
        b or harness.fake_member("b", load_time=2.0),
        harness.pool(POOL, ["a", "b"], default="a", swap_budget=swap_budget, **pool_spec),
        harness.router(ROUTER, ["a", "b"], response_header_timeout=response_header_timeout),
    )
    harness.wait_pool_ready(kubectl, namespace, POOL, resident="a", within=60)
    (router,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=60)
    return Stack(kubectl, namespace, installation, router)


@pytest.fixture
def stack(kubectl: Kubectl, namespace: str, installed: Installation) -> Stack:
    return bring_up(kubectl, namespace, installed)


def chat(client: openai.OpenAI, model: str, max_tokens: int = 8) -> str:
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens)
    assert reply.model == model
    content = reply.choices[0].message.content
    assert content
    return content


def stream(client: openai.OpenAI, model: str, max_tokens: int = 8) -> list[str]:
    """The text pieces of a streamed chat completion; asserts it ended properly."""
    pieces: list[str] = []
    finish = None
    with client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=max_tokens, stream=True
    ) as chunks:
        for chunk in chunks:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
    assert finish is not None, "the stream ended without a finish_reason"
    assert "".join(pieces)
    return pieces


def streaming(client: openai.OpenAI, model: str, max_tokens: int) -> threading.Thread:
    """A streamed request for `model` running in a thread, returned once its first chunk
    arrived: the member is busy until the thread ends."""
    first_token = threading.Event()

    def read() -> None:
        with client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=max_tokens, stream=True
        ) as chunks:
            for _ in chunks:
                first_token.set()

    busy = threading.Thread(target=read)
    busy.start()
    assert first_token.wait(30), f"{model} never started streaming"
    return busy


# --- A cold pool, a swap, coalescing, and what /metrics says about them ------------------


def test_cold_pool_serves_default_swaps_once_for_the_other_and_metrics_count_it(
    stack: Stack,
) -> None:
    with stack.client() as client:
        # The pool was cold until it loaded its default; nobody asked for a swap.
        assert stack.pool().get("request") is None
        chat(client, "a")
        assert len(stream(client, "a", max_tokens=6)) >= 2
        states = {m.id: m.model_extra.get("state") for m in client.models.list()
                  if m.model_extra is not None}
        assert states == {"a": "resident", "b": "stopped"}

        started = time.monotonic()
        chat(client, "b")  # held through the swap, then served
        held_for = time.monotonic() - started
        # The reply can come before the status says so: the router dispatches as soon as
        # the target answers its readiness path, the kubelet marks it Ready a tick later.
        after_swap = harness.wait_pool_ready(
            stack.kubectl, stack.namespace, POOL, resident="b", within=10
        )["status"]
        assert after_swap["residentMember"] == "b"
        assert after_swap["lastSwap"]["from"] == "a"
        assert after_swap["lastSwap"]["to"] == "b"
        assert after_swap["lastSwap"]["outcome"] == "Succeeded"
        generation = after_swap["request"]["generation"]
        assert stack.swaps("b") == 1

        # Same-model demand: sequential, concurrent, streamed. No second swap.
        for _ in range(2):
            chat(client, "b")
        threads = [threading.Thread(target=stream, args=(client, "b")) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert stack.pool()["request"]["generation"] == generation
        assert stack.pool()["lastSwap"]["start"] == after_swap["lastSwap"]["start"]
        assert stack.swaps("b") == 1
        assert stack.swaps("a") == 1  # the cold load of the default

    families = stack.router_metrics(answered=8)
    missing = {n: t for n, t in ROUTER_FAMILIES.items()
               if n not in families or families[n].type != t}
    assert not missing, f"router families missing or of the wrong type: {missing}"

    def value(name: str, **labels: str) -> float:
        return harness.sample_sum(families, name, router=ROUTER, **labels)

    assert value("modelpool_requests_total", model="a", code="200") == 2
    assert value("modelpool_requests_total", model="b", code="200") == 6
    assert value("modelpool_requests_total") == 8
    assert value("modelpool_request_duration_seconds_count", model="b") == 6
    assert value("modelpool_time_to_first_byte_seconds_count", model="b") == 6
    # a: resident before the first request, unless the router saw its endpoint a moment late.
    assert (value("modelpool_coalesced_total", pool=POOL, member="a")
            + value("modelpool_hold_duration_seconds_count", pool=POOL, member="a")) == 2
    # b: one request held through the swap, five coalesced onto the new resident.
    assert value("modelpool_hold_duration_seconds_count", pool=POOL, member="b") == 1
    assert value("modelpool_coalesced_total", pool=POOL, member="b") == 5
    held = value("modelpool_hold_duration_seconds_sum", pool=POOL, member="b")
    assert 2.0 <= held <= held_for, (held, held_for)  # at least b's load time
    assert value("modelpool_held_requests") == 0
    assert value("modelpool_upstream_errors_total") == 0


def test_a_streamed_request_held_through_a_swap_starts_at_once_and_says_why_it_waits(
    stack: Stack,
) -> None:
    """sidecar.held_stream through a real swap: the 200 and its event-stream headers go out
    while the pool is still swapping, an SSE comment says what the request waits for, and
    the member's own events follow in the same response."""
    body = {"model": "b", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{stack.base_url}/chat/completions", json=body,
                      timeout=60.0) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        status = stack.pool()
        assert status.get("residentMember") != "b" or status.get("phase") != "Ready", status
        lines = [line for line in response.iter_lines() if line]
    assert lines[0].startswith(": loading b, "), lines[:3]
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])
    harness.wait_pool_ready(stack.kubectl, stack.namespace, POOL, resident="b", within=30)


def test_an_idle_pool_gives_the_gpu_back_and_the_next_request_loads_it_again(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    """spec.idleUnloadAfter through the router: traffic keeps the resident loaded past it;
    once it stops, the member is unloaded (its pod gone, the GPU free), the pool is Cold
    and says why, and the next request through the router loads it and is answered."""
    stack = bring_up(kubectl, namespace, installed, idleUnloadAfter="6s")
    with stack.client() as client:
        # The router may have taken longer than 6 s to be Ready, and the default unloaded
        # meanwhile: then this request loads it, and is answered before the status says so.
        chat(client, "a", max_tokens=1)
        harness.wait_pool_ready(kubectl, namespace, POOL, resident="a", within=30)
        started = time.monotonic()
        while time.monotonic() - started < 12:  # twice idleUnloadAfter of light traffic
            chat(client, "a", max_tokens=1)
            assert stack.pool().get("residentMember") == "a", stack.pool()
            time.sleep(1.0)  # the traffic's pace, not a wait for anything

        def cold() -> Json | None:
            status = stack.pool()
            return status if status.get("phase") == "Cold" else None

        status = harness.eventually(cold, "the pool Cold once a served nothing for 6s", 60,
                                    explain=stack.pool)
        assert status["idleUnloaded"]["member"] == "a", status
        assert status.get("residentMember") is None
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "IdleUnloaded"), ready
        harness.eventually(lambda: True if not harness.member_pods(kubectl, namespace) else None,
                           "a's pod gone", 60)
        # The Event is posted beside the status write, not before it: waited for.
        harness.eventually(
            lambda: [e for e in kubectl.json("get", "events", "-n", namespace, "--field-selector",
                                             f"involvedObject.name={POOL}")["items"]
                     if e.get("reason") == "IdleUnloaded"] or None,
            "the pool's IdleUnloaded Event", 30)
        assert stack.pool().get("phase") == "Cold"  # not the default loaded again

        assert chat(client, "a")  # held through the load, then answered
    status = harness.wait_pool_ready(kubectl, namespace, POOL, resident="a", within=30)
    assert status["status"].get("idleUnloaded") is None


# Four servers to start, three swaps on real pods and four servers to stop afterwards:
# about 90 s on kind, more than the default 120 s per test once the host is loaded.
@pytest.mark.timeout(300)
def test_a_backend_falls_through_to_a_member_that_is_loaded_instead_of_waiting(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    """Fallback through the router on real pods: `small` is a ModelServer of its own (no
    pool, on CPU: the local testbed's node has one GPU) that answers for the pool's
    members. With activation Never a request for b goes to small at once and no swap is
    asked for. With IfIdle a request is held through its member's swap while the resident
    is idle, and goes to small while the resident streams (the swap could not start at
    once). The client's model reaches the fallback unchanged, and the response says who
    answered."""
    harness.apply(
        kubectl, namespace,
        harness.fake_member("a", load_time=1.0, tokens_per_second=20),
        harness.fake_member("b", load_time=1.0),
        harness.fake_member("small", load_time=0.5, gpu=0),
        harness.pool(POOL, ["a", "b"], default="a"))
    never = harness.router(ROUTER, ["a", "b", "small"])
    never["spec"]["backends"][1].update(activation="Never", fallback={"name": "small"})
    harness.apply(kubectl, namespace, never)
    harness.wait_pool_ready(kubectl, namespace, POOL, resident="a", within=60)
    harness.eventually(
        lambda: True if [p for p in harness.member_pods(kubectl, namespace, "small")
                         if p.ready] else None, "small Ready", 60)
    (router,) = harness.wait_router_ready(kubectl, namespace, ROUTER, within=60)
    stack = Stack(kubectl, namespace, installed, router)
    with stack.client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model="b", messages=MESSAGES, max_tokens=2)
        assert raw.headers["x-modelpool-backend"] == "small"
        assert raw.parse().model == "small"  # small's own id; the request said b
        assert stack.pool().get("request") is None and stack.pool()["residentMember"] == "a"

        if_idle = harness.router(ROUTER, ["a", "b", "small"])
        for backend in if_idle["spec"]["backends"][:2]:
            backend.update(activation="IfIdle", fallback={"name": "small"})
        harness.apply(kubectl, namespace, if_idle)

        def served_by_b() -> bool | None:
            raw = client.chat.completions.with_raw_response.create(
                model="b", messages=MESSAGES, max_tokens=2)
            return True if raw.headers["x-modelpool-backend"] == "b" else None

        # Once the router has the new config, which it follows through the API within a
        # second (until then Never sends b to small; the kubelet alone would refresh the
        # mounted file up to a minute or more later): a is idle, so b is held through its
        # own swap and answered by b itself.
        harness.eventually(served_by_b, "b held and served by b once IfIdle is loaded", 30)
        harness.wait_pool_ready(kubectl, namespace, POOL, resident="b", within=30)

        # b streams: a request for a (IfIdle) cannot start its swap at once, so small answers
        busy = streaming(client, "b", 150)
        raw = client.chat.completions.with_raw_response.create(
            model="a", messages=MESSAGES, max_tokens=2)
        busy.join(60)
        assert raw.headers["x-modelpool-backend"] == "small"
        assert stack.pool()["residentMember"] == "b"
        # b idle again: a is held through its swap and answered by a
        raw = client.chat.completions.with_raw_response.create(
            model="a", messages=MESSAGES, max_tokens=2)
        assert raw.headers["x-modelpool-backend"] == "a"
        assert raw.parse().model == "a"
    harness.wait_pool_ready(kubectl, namespace, POOL, resident="a", within=30)


# --- Past the hold budget: 503 with Retry-After; an SDK client that retries gets through --


def test_past_the_hold_budget_503_with_retry_after_and_a_retrying_client_gets_its_answer(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    # a streams 10 tokens a second, so a long reply keeps it busy: the reconciler defers the
    # swap to b (PodsBusy) past the 10 s budget, and the held requests for b run out.
    stack = bring_up(
        kubectl, namespace, installed,
        a=harness.fake_member("a", load_time=1.0, tokens_per_second=10),
        b=harness.fake_member("b", load_time=1.0),
        swap_budget="10s",
    )
    busy_tokens = 130  # 13 s busy
    with stack.client(timeout=60) as plain, stack.client(max_retries=6, timeout=60) as patient:
        busy = streaming(plain, "a", busy_tokens)

        outcome: dict[str, Any] = {}

        def retrying() -> None:
            raw = patient.chat.completions.with_raw_response.create(
                model="b", messages=MESSAGES, max_tokens=4
            )
            outcome["retries"] = raw.retries_taken
            outcome["reply"] = raw.parse()
            outcome["at"] = time.monotonic()

        patient_thread = threading.Thread(target=retrying)
        started = time.monotonic()
        patient_thread.start()
        with pytest.raises(openai.APIStatusError) as refused:
            plain.chat.completions.create(model="b", messages=MESSAGES, max_tokens=4)
        waited = time.monotonic() - started
        assert refused.value.status_code == 503
        retry_after = refused.value.response.headers.get("Retry-After")
        assert retry_after is not None and int(retry_after) >= 1, retry_after
        assert 9.0 <= waited <= 20.0, f"held {waited:.1f}s against a 10s budget"
        error = refused.value.body
        assert isinstance(error, dict) and error.get("code") in (
            "swap_budget_exceeded", "swap_abandoned"), error
        # The retried swap's budget counts from its start, and a loaded node can take 10 s
        # to schedule, start and report b Ready: abandoned there, the pool would go back to
        # its default after b had answered. The budget is read at every step of a swap.
        stack.kubectl("patch", "modelpool", POOL, "-n", stack.namespace, "--type=merge",
                      "-p", '{"spec": {"swapBudget": "60s"}}')

        patient_thread.join(90)
        busy.join(30)
        assert "reply" in outcome, "the retrying client got no answer"
        assert outcome["reply"].model == "b"
        assert outcome["retries"] >= 1
        pool = harness.wait_pool_ready(
            stack.kubectl, stack.namespace, POOL, resident="b", within=10
        )["status"]  # the reply can come before the status says so
        assert pool["residentMember"] == "b"
        assert pool["lastSwap"]["outcome"] == "Succeeded"
    refusals = 1 + outcome["retries"]  # the plain client's, and each retried attempt's
    families = stack.router_metrics(answered=refusals + 1)
    assert harness.sample_sum(families, "modelpool_requests_total", model="b",
                              code="503") == refusals
    assert harness.sample_sum(families, "modelpool_requests_total", model="b",
                              code="200") == 1


# --- A swap longer than responseHeaderTimeout -------------------------------------------


def test_a_swap_longer_than_response_header_timeout_but_inside_swap_budget_succeeds(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    stack = bring_up(
        kubectl, namespace, installed,
        b=harness.fake_member("b", load_time=6.0),
        swap_budget="60s",
        response_header_timeout="2s",
    )
    with stack.client() as client:
        streamed: list[list[str]] = []
        other = threading.Thread(target=lambda: streamed.append(stream(client, "b")))
        started = time.monotonic()
        other.start()
        chat(client, "b")
        elapsed = time.monotonic() - started
        other.join(60)
    assert streamed, "the streamed request for b got no answer"
    assert elapsed >= 6.0, f"answered after {elapsed:.1f}s, before b could have loaded"
    # The reply can come before the status says so (the router probes the target itself).
    ready = harness.wait_pool_ready(kubectl, namespace, POOL, resident="b", within=10)
    last = ready["status"]["lastSwap"]
    assert last["to"] == "b" and last["outcome"] == "Succeeded"
    assert last["durationSeconds"] > 2.0


# --- A client that leaves mid-swap ------------------------------------------------------


async def test_a_client_that_disconnects_mid_swap_does_not_abort_the_swap(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    stack = await asyncio.to_thread(
        bring_up, kubectl, namespace, installed,
        b=harness.fake_member("b", load_time=6.0),
    )
    async with openai.AsyncOpenAI(
        base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60
    ) as client:
        request = asyncio.create_task(
            client.chat.completions.create(model="b", messages=MESSAGES, max_tokens=4)
        )

        def loading() -> Json | None:
            pool = stack.pool()
            swap = pool.get("swap") or {}
            return pool if swap.get("to") == "b" and swap.get("phase") == "Loading" else None

        swapping = await asyncio.to_thread(harness.eventually, loading, "b loading", 30)
        assert not request.done()
        request.cancel()  # the client hangs up while b loads
        with contextlib.suppress(asyncio.CancelledError):
            await request

    generation = swapping["swap"]["generation"]
    ready = await asyncio.to_thread(
        harness.wait_pool_ready, kubectl, namespace, POOL, "b", 30
    )
    last = ready["status"]["lastSwap"]
    assert last["to"] == "b" and last["outcome"] == "Succeeded"
    assert last["generation"] == generation
    with stack.client() as sync_client:
        await asyncio.to_thread(chat, sync_client, "b")
    assert stack.pool()["request"]["generation"] == generation  # served, no new request
    families = await asyncio.to_thread(stack.router_metrics, 2)  # the 499 and the 200
    assert harness.sample_sum(families, "modelpool_requests_total", model="b", code="499") == 1


# --- The resident's process killed out of band ------------------------------------------

# The bound: the request that finds the dead process (a reset on a kept-alive connection,
# or the refused port) is not answered 502: the router checks that the address refuses a
# fresh connection, marks it bad, re-verifies residency and dispatches the request again
# through the activator, which holds it until the restarted server is Ready. One 502 is
# tolerated for the race in which the process is back before that check. Service is back
# within the restart, a's load time and the readiness probe's period, with room to spare.
KILL_RECOVERY_SECONDS = 30.0
MAX_502_AFTER_KILL = 1


def test_after_the_resident_process_is_killed_the_router_does_not_keep_answering_502(
    stack: Stack, testbed: testbeds.Testbed
) -> None:
    (pod,) = [p for p in harness.member_pods(stack.kubectl, stack.namespace, "a")
              if p.phase == "Running"]
    with stack.client(timeout=60) as client:
        chat(client, "a")
        testbed.kill(pod)
        killed = time.monotonic()
        outcomes: list[tuple[int, str | None]] = []
        recovered = None
        while time.monotonic() - killed < KILL_RECOVERY_SECONDS + 30:
            try:
                chat(client, "a")
                outcomes.append((200, None))
            except openai.APIStatusError as e:
                code = e.body.get("code") if isinstance(e.body, dict) else None
                outcomes.append((e.status_code, code))
            if outcomes[-1][0] == 200:
                recovered = time.monotonic() - killed
                break
        after = []
        for _ in range(5):
            try:
                chat(client, "a")
                after.append(200)
            except openai.APIStatusError as e:
                after.append(e.status_code)
    assert recovered is not None, f"no 200 after the kill: {outcomes}"
    statuses = [status for status, _ in outcomes]
    assert set(statuses) <= {200, 502}, outcomes
    assert statuses.count(502) <= MAX_502_AFTER_KILL, outcomes
    assert after == [200] * 5, after
    assert recovered <= KILL_RECOVERY_SECONDS, f"{recovered:.1f}s to recover: {outcomes}"
    restarted = harness.member_pods(stack.kubectl, stack.namespace, "a")
    assert [p.restarts for p in restarted] == [1]  # the same pod, restarted by the node
    # The router saw the dead endpoint (counted by kind) whether or not a client got 502.
    families = stack.router_metrics(answered=1 + len(outcomes) + len(after))
    errors = harness.sample_sum(families, "modelpool_upstream_errors_total", backend="a")
    assert 1 <= errors <= 2 + statuses.count(502), (errors, outcomes)
    assert harness.sample_sum(families, "modelpool_requests_total", model="a",
                              code="502") == statuses.count(502)


# --- The router's own token -------------------------------------------------------------


def test_the_router_token_cannot_patch_a_model_server_or_read_a_secret(
    stack: Stack, testbed: testbeds.Testbed, tmp_path: Path
) -> None:
    kubectl, ns = stack.kubectl, stack.namespace
    kubectl("create", "secret", "generic", "weights-token", "-n", ns,
            "--from-literal=token=do-not-read")
    config = testbed.pod_kubeconfig(stack.router, tmp_path)

    def as_router(*args: str) -> subprocess.CompletedProcess[str]:
        return run_kubectl(kubectl.binary, config, "-n", ns, *args)

    def can_i(*args: str) -> str:
        return as_router("auth", "can-i", *args).stdout.strip()

    # What it must be able to do, so that the refusals below are RBAC's and not a bad token.
    assert can_i("patch", "modelpools.modelpool.dev", "--subresource=status") == "yes"
    assert can_i("watch", "endpointslices.discovery.k8s.io") == "yes"
    config_map = f"{ROUTER}-config"  # its own config, which it follows through the API
    assert can_i("watch", f"configmaps/{config_map}") == "yes"
    # What it must not.
    assert can_i("get", "configmaps/another-config") == "no"
    assert can_i("list", "configmaps") == "no"
    assert can_i("patch", "modelservers.modelpool.dev") == "no"
    assert can_i("patch", "modelpools.modelpool.dev") == "no"
    assert can_i("get", "secrets") == "no"
    assert can_i("patch", "deployments.apps") == "no"

    patched = as_router("patch", "modelservers.modelpool.dev", "a", "--type=merge",
                        "-p", '{"spec":{"image":"example.com/other:latest"}}')
    assert patched.returncode != 0 and "forbidden" in patched.stderr.lower(), patched.stderr
    read = as_router("get", "secret", "weights-token", "-o", "jsonpath={.data.token}")
    assert read.returncode != 0 and "forbidden" in read.stderr.lower(), read.stderr
    assert "do-not-read" not in read.stdout
    image = kubectl.json("get", "modelservers.modelpool.dev", "a", "-n", ns)["spec"]["image"]
    assert image == harness.FAKE_MODEL_IMAGE


def run_kubectl(binary: str, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, f"--kubeconfig={kubeconfig}", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )



# --- The examples, as a user applies them -----------------------------------------------


def test_the_example_pool_serves_both_models_through_its_router(
    kubectl: Kubectl, namespace: str, installed: Installation
) -> None:
    """The examples as the testbeds run them (overlays/examples-testbed: gemma a real
    llama-server, qwen the fake in vLLM mode) applied into the test's namespace; both
    models answer by name and by alias, streaming and not, and llama.cpp's own over-context
    400 reaches the client as llama-server wrote it."""
    harness.apply_examples(kubectl, namespace, harness.EXAMPLES_TESTBED)
    harness.wait_pool_ready(kubectl, namespace, "gpu0", resident="gemma", within=90)
    (router,) = harness.wait_router_ready(kubectl, namespace, "chat", within=60)
    with openai.OpenAI(base_url=harness.base_url(router), api_key="unused",
                       max_retries=0, timeout=60) as client:
        chat(client, "gemma")
        stream(client, "gemma-3-4b-it")  # an alias
        with pytest.raises(openai.BadRequestError) as too_long:
            client.completions.create(model="gemma", prompt="the pool " * 1500, max_tokens=4)
        assert too_long.value.body is not None
        assert "exceed_context_size_error" in str(too_long.value.body), too_long.value.body
        reply = client.chat.completions.create(
            model="Qwen/Qwen2.5-1.5B-Instruct", messages=MESSAGES, max_tokens=4
        )
        assert reply.choices[0].message.content
        assert len(stream(client, "qwen")) >= 2
    # The reply can come before the status says so (the router probes the target itself).
    pool = harness.wait_pool_ready(kubectl, namespace, "gpu0", resident="qwen", within=10)[
        "status"
    ]
    assert pool["residentMember"] == "qwen"
    assert pool["lastSwap"]["from"] == "gemma" and pool["lastSwap"]["outcome"] == "Succeeded"


# --- The install the tests use is the user's ----------------------------------------------


def test_the_scoped_install_is_the_users_install_but_for_the_reconcilers_scope(
    kubectl: Kubectl,
) -> None:
    """What `harness.install(scope=NS)` applies: every document of overlays/local as it is,
    except that the reconciler Deployment watches NS only, under its own name and selector."""
    user = harness.rendered_install(kubectl)
    deployments = [d for d in user if d["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == [harness.RECONCILER]
    (deployment,) = deployments
    scoped = harness.scoped_deployment(deployment, "ns1")
    assert scoped["metadata"]["name"] == harness.scoped_reconciler_name("ns1")
    assert scoped["spec"]["selector"]["matchLabels"] == {
        **deployment["spec"]["selector"]["matchLabels"], harness.LABEL_SCOPE: "ns1"}
    container = scoped["spec"]["template"]["spec"]["containers"][0]
    original = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["run", "--namespace", "ns1"]
    assert {k: v for k, v in container.items() if k != "args"} == {
        k: v for k, v in original.items() if k != "args"}
    assert scoped["spec"]["template"]["spec"]["serviceAccountName"] == "modelpool-reconciler"
    assert deployment["metadata"]["name"] == harness.RECONCILER  # the original is untouched
