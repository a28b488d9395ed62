"""Members reachable only through their router, enforced by a real NetworkPolicy
implementation (kube-router's firewall, e2e/kind/kube-router.yaml): a pod without a
fronting router's label, a pod that merely claims to be another router, and this machine
are all refused at the member's port; the router reaches it (with its API key in force)
and the reconciler's idle probe still does, so a swap drains and completes. With
`allowDirectAccess` the member renders no policy and any pod reaches it."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.kind_tests.test_kind import CONTROL_PLANE
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

API_KEY = "sk-modelpool-test"
HELLO: Any = [{"role": "user", "content": "hello"}]
# What a client pod prints: 200 as soon as a GET answers it, else how the last try failed
# after 10 s of trying (the firewall learns a new pod's address a moment after it starts,
# so one refusal proves nothing either way).
PROBE = """
import sys, time, urllib.request
deadline, last = time.monotonic() + 10, "no try"
while time.monotonic() < deadline:
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
        sys.exit(0)
    except Exception as e:
        last = f"failed: {type(e).__name__} {e}"
    time.sleep(0.5)
print(last)
"""


def from_a_pod(kubectl: Kubectl, namespace: str, name: str, url: str,
               labels: dict[str, str] | None = None) -> str:
    """Run a one-shot pod in `namespace` that GETs `url`; what it printed."""
    start_client(kubectl, namespace, name, url, labels)
    return client_output(kubectl, namespace, name)


def start_client(kubectl: Kubectl, namespace: str, name: str, url: str,
                 labels: dict[str, str] | None = None) -> None:
    """A one-shot pod in `namespace` that GETs `url`, started."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "client", "image": harness.FAKE_MODEL_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", PROBE, url],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }
    harness.apply(kubectl, namespace, pod)


def client_output(kubectl: Kubectl, namespace: str, name: str) -> str:
    """What the client pod `name` printed, once it has ended."""
    def done() -> bool | None:
        phase = harness.get(kubectl, namespace, "pod", name)["status"].get("phase")
        return True if phase in ("Succeeded", "Failed") else None

    harness.eventually(done, f"pod {name} done", 90)
    return kubectl("logs", name, "-n", namespace).stdout.strip()


def from_here(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.status)
    except (urllib.error.URLError, OSError) as e:
        return f"failed: {e}"


def test_only_its_routers_and_the_reconciler_reach_a_member(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    kubectl("create", "secret", "generic", "router-keys", "-n", ns,
            f"--from-literal=keys={API_KEY}")
    router = harness.router_on_node(harness.router("chat", ["a", "b"]), CONTROL_PLANE)
    router["spec"]["proxy"]["apiKeySecret"] = {"name": "router-keys"}
    harness.apply(kubectl, ns, harness.fake_member("a", load_time=0.5),
                  harness.fake_member("b", load_time=0.5),
                  harness.pool("slot", ["a", "b"], default="a"), router)
    (router_pod,) = harness.wait_router_ready(kubectl, ns, "chat", None, 180.0)
    harness.wait_pool_ready(kubectl, ns, "slot", "a", 120.0)
    status = harness.get(kubectl, ns, f"modelservers.{harness.GROUP}", "a")["status"]
    assert status["networkPolicy"] == "a"
    (member,) = [p for p in harness.member_pods(kubectl, ns, "a") if p.ready]
    health = f"http://{member.ip}:8080/health"

    # Refused: a pod of no router, a pod claiming another router's label, this machine.
    # The same request from a pod the policy admits answers, so the refusals are the
    # policy's and not a dead member. The three pods run side by side (each refused one
    # tries for 10 s).
    start_client(kubectl, ns, "stranger", health)
    start_client(kubectl, ns, "impostor", health, {harness.LABEL_ROUTER: "other"})
    start_client(kubectl, ns, "fronting", health, {harness.LABEL_ROUTER: "chat"})
    assert from_here(health).startswith("failed:")
    assert client_output(kubectl, ns, "stranger").startswith("failed:")
    assert client_output(kubectl, ns, "impostor").startswith("failed:")
    assert client_output(kubectl, ns, "fronting") == "200"

    # Through the router: the key is demanded, and there is no way around it.
    base = harness.base_url(router_pod)
    with (openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=60) as client,
          pytest.raises(openai.AuthenticationError)):
        client.chat.completions.create(model="a", messages=HELLO, max_tokens=2)
    with openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=120) as client:
        assert client.chat.completions.create(model="a", messages=HELLO,
                                              max_tokens=2).choices[0].message.content
        # A swap: the reconciler's idle probe reaches a (the drain), then b answers.
        reply = client.chat.completions.create(model="b", messages=HELLO, max_tokens=2)
        assert reply.model == "b" and reply.choices[0].message.content
    pool = harness.wait_pool_ready(kubectl, ns, "slot", "b", 30.0)["status"]
    assert pool["lastSwap"]["from"] == "a" and pool["lastSwap"]["outcome"] == "Succeeded"


def test_a_member_that_allows_direct_access_is_reached_by_any_pod(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    member = harness.fake_member("open", load_time=0.5)
    member["spec"]["allowDirectAccess"] = True
    harness.apply(kubectl, ns, member)

    def ready() -> harness.Pod | None:
        pods = [p for p in harness.member_pods(kubectl, ns, "open") if p.ready]
        return pods[0] if pods else None

    pod = harness.eventually(ready, "the open member Ready", 120)
    assert kubectl("get", "networkpolicy", "open", "-n", ns, check=False).returncode != 0
    assert from_a_pod(kubectl, ns, "stranger", f"http://{pod.ip}:8080/health") == "200"
    assert from_here(f"http://{pod.ip}:8080/health") == "200"
