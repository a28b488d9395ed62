"""A router rolled under steady traffic through its Service, on a real kubelet and
kube-proxy: no request fails, with the OpenAI SDK's retries off.

The kubelet's SIGTERM and the endpoints' update race: for a moment kube-proxy still sends
new connections to the terminating pod, and a kept-alive connection to it stays pinned.
The router goes on accepting for its shutdown delay, not ready, and closes each connection
after its answer, so every client moves to a new pod without an error; a stream in flight
goes on to its end within the shutdown grace period.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.local.fixtures import Kubectl
from reconciler.render import router_object_name

# the rollout waits for two new router pods and two old ones to drain, on a loaded host
pytestmark = pytest.mark.timeout(600)

HELLO: Any = [{"role": "user", "content": "hello"}]
CLIENTS = 3  # threads sending one short request after another, plus one streaming
LONG_TOKENS = 2500


@dataclass(frozen=True)
class LongEnd:
    tokens: int
    finish_reason: str | None
    at: float  # time.monotonic() when it ended


class Traffic:
    """Clients of the router's Service, each on its own keep-alive connection."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered = 0
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._chat) for _ in range(CLIENTS)]
        self.threads.append(threading.Thread(target=self._streams))

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0,
                             timeout=60)

    def _count(self, failure: str | None) -> None:
        with self.lock:
            if failure is None:
                self.answered += 1
            else:
                self.failures.append(failure)

    def _chat(self) -> None:
        with self._client() as client:
            while not self.stop.is_set():
                try:
                    reply = client.chat.completions.create(model="a", messages=HELLO,
                                                           max_tokens=2)
                    self._count(None if reply.choices[0].finish_reason == "length"
                                else f"chat: {reply}")
                except openai.OpenAIError as e:
                    self._count(f"chat at {time.strftime('%X')}: {e!r}")

    def _streams(self) -> None:
        with self._client() as client:
            while not self.stop.is_set():
                try:
                    with client.chat.completions.create(model="a", messages=HELLO,
                                                        max_tokens=20, stream=True) as chunks:
                        ends = [c.choices[0].finish_reason for c in chunks if c.choices]
                    self._count(None if ends[-1:] == ["length"] else f"stream ended {ends}")
                except openai.OpenAIError as e:
                    self._count(f"stream at {time.strftime('%X')}: {e!r}")

    def long_stream(self, tokens: int, ends: list[LongEnd | openai.OpenAIError]) -> None:
        """One stream of `tokens` tokens; what it ended with (or its error) goes to `ends`."""
        try:
            with self._client() as client, client.chat.completions.create(
                model="a", messages=HELLO, max_tokens=tokens, stream=True
            ) as chunks:
                choices = [c.choices[0] for c in chunks if c.choices]
            tokens = sum(1 for c in choices if c.delta.content)
            ends.append(LongEnd(tokens, choices[-1].finish_reason, time.monotonic()))
        except openai.OpenAIError as e:
            ends.append(e)

    def answered_at_least(self, n: int) -> bool | None:
        with self.lock:
            return True if self.answered >= n else None


def test_a_rollout_of_the_router_under_traffic_fails_no_request(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    router = harness.router("chat", ["a"], replicas=2)
    # room for a long stream to end after its pod's SIGTERM, and the kubelet waits for it
    router["spec"]["proxy"]["shutdownGracePeriod"] = "120s"
    harness.apply(
        kubectl, ns,
        harness.fake_member("a", load_time=0.5),
        harness.pool("slot", ["a"], default="a"),
        router)
    old = {p.name for p in harness.wait_router_ready(kubectl, ns, "chat", None, 180.0)}
    harness.wait_pool_ready(kubectl, ns, "slot", "a", 120.0)
    service = harness.get(kubectl, ns, "service", router_object_name("chat"))
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
    base_url = f"http://{service['spec']['clusterIP']}:{port}/v1"

    with Traffic(base_url) as traffic:
        harness.eventually(lambda: traffic.answered_at_least(20), "traffic flowing", 60,
                           explain=lambda: traffic.failures)
        # a stream of 50 s (2,500 tokens at 50 a second) in flight while both old pods get
        # their SIGTERM: it goes on to its end
        long_end: list[LongEnd | openai.OpenAIError] = []
        long = threading.Thread(target=traffic.long_stream, args=(LONG_TOKENS, long_end))
        long.start()
        kubectl("rollout", "restart", f"deployment/{router_object_name('chat')}", "-n", ns)
        kubectl("rollout", "status", f"deployment/{router_object_name('chat')}", "-n", ns,
                "--timeout=300s", timeout=320)
        rolled_out = time.monotonic()

        def old_pods_gone() -> bool | None:
            names = {p.name for p in harness.router_pods(kubectl, ns, "chat")}
            return True if not names & old else None

        harness.eventually(old_pods_gone, "the old router pods gone", 120)
        rolled = traffic.answered
        harness.eventually(lambda: traffic.answered_at_least(rolled + 20),
                           "traffic flowing through the new pods", 60,
                           explain=lambda: traffic.failures)
        long.join(120)
    assert traffic.failures == [], traffic.failures
    (end,) = long_end
    assert isinstance(end, LongEnd), end
    assert (end.tokens, end.finish_reason) == (LONG_TOKENS, "length")
    assert end.at > rolled_out, "the rollout ended while the long stream still ran"
    new = harness.router_pods(kubectl, ns, "chat")
    assert len(new) == 2 and not {p.name for p in new} & old
    deployment = harness.get(kubectl, ns, "deployment", router_object_name("chat"))
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 130
