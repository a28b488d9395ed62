"""spec.prewarm on a real kubelet: while a swap drains and unloads the incumbent, a pod on
the incumbent's node reads the target's weights from its volume (a PersistentVolume on the
GPU node, reached from a namespace that enforces `restricted`), and it is gone once the
swap is over. The time it saves is measured by benchmarks/bench_prewarm.py."""

from __future__ import annotations

import subprocess
from typing import Any

import openai
import pytest

from e2e import harness
from e2e.kind_tests.test_kind import CONTROL_PLANE, TWO_GPUS
from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.timeout(600)

NODE = TWO_GPUS  # the node with two GPUs
HELLO: Any = [{"role": "user", "content": "hello"}]


def member(name: str) -> harness.Json:
    server = harness.on_node(harness.fake_member(name, load_time=0.5), NODE)
    server["spec"].update(model=f"/weights/{name}.gguf",
                          storage={"pvc": "weights", "mountPath": "/weights"})
    return server


def test_a_swap_reads_the_targets_weights_on_the_incumbents_node_while_it_unloads(
    kind_kubectl: Kubectl, restricted_namespace: str,
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    directory = f"/var/lib/modelpool-test/{ns}"
    subprocess.run(["docker", "exec", NODE, "sh", "-c",
                    f"mkdir -p {directory} && for m in a b; do "
                    f"head -c 8388608 /dev/urandom > {directory}/$m.gguf; done && "
                    f"chmod -R a+rX {directory}"], check=True, timeout=60)
    pv, pvc = harness.node_volume(ns, "weights", NODE, directory)
    harness.apply(kubectl, ns, pv)
    try:
        harness.apply(kubectl, ns, pvc, member("a"), member("b"),
                      harness.pool("slot", ["a", "b"], default="a"),
                      harness.router_on_node(harness.router("chat", ["a", "b"]),
                                             CONTROL_PLANE))
        (router,) = harness.wait_router_ready(kubectl, ns, "chat", None, 180.0)
        harness.wait_pool_ready(kubectl, ns, "slot", "a", 120.0)
        with openai.OpenAI(base_url=harness.base_url(router), api_key="unused",
                           max_retries=0, timeout=120) as client:
            reply = client.chat.completions.create(model="b", messages=HELLO, max_tokens=2)
            assert reply.model == "b"
        harness.wait_pool_ready(kubectl, ns, "slot", "b", 60.0)

        def events(name: str) -> list[harness.Json]:
            items: list[harness.Json] = kubectl.json(
                "get", "events", "-n", ns, "--field-selector",
                f"involvedObject.name={name}")["items"]
            return items

        def prewarmed() -> list[harness.Json] | None:
            found = [e for e in events("slot") if e.get("reason") == "Prewarming"]
            return found or None

        (said,) = harness.eventually(prewarmed, "a Prewarming Event on the pool", 30)
        assert f"reading b's weights into the page cache of {NODE}" in said["message"], said
        # the kubelet ran it: admitted under `restricted`, on the incumbent's node
        started = harness.eventually(
            lambda: [e for e in events("slot-prewarm") if e.get("reason") == "Started"] or None,
            "the kubelet's Started Event of the prewarm pod", 30)
        host = started[0].get("reportingInstance") or started[0].get("source", {}).get("host")
        assert host == NODE, started
        # and it is gone once b loaded
        harness.eventually(
            lambda: True if kubectl.json_or_none("get", "pod", "slot-prewarm", "-n",
                                                 ns) is None else None,
            "the prewarm pod gone after the swap", 60)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kubectl("delete", "pv", pv["metadata"]["name"], "--wait=false", check=False)
        subprocess.run(["docker", "exec", NODE, "rm", "-rf", directory], check=False,
                       timeout=60)
