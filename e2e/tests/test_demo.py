"""`modelpool-local demo`, the first command a newcomer runs, works from nothing.

It starts a cluster of its own (in the test's temporary directory), installs everything,
narrates a cold load, a swap and a coalesced burst, and leaves a router that answers at
the address it printed. The cluster is taken down afterwards.
"""

from __future__ import annotations

import io
import json
import re
import urllib.request
from pathlib import Path

import pytest

from e2e import harness
from e2e.local import controlplane, demo

# The demo starts a local cluster of its own, whatever testbed the run's other e2e tests use.
TESTBED = "local"


@pytest.mark.timeout(400)
def test_the_demo_narrates_a_swap_and_leaves_the_router_serving(tmp_path: Path) -> None:
    state = tmp_path / "demo-cluster"
    out = io.StringIO()
    try:
        assert demo.run_demo(state, out=out) == 0, out.getvalue()
        text = out.getvalue()
        # The cold load at install, the held swap, the burst served by one swap.
        assert re.search(r"pool\s+swap \(none\) -> gemma: Loading", text), text
        assert re.search(r"router\s+holds 1 request\(s\) for qwen", text), text
        assert re.search(r"pool\s+lastSwap gemma -> qwen: Succeeded", text), text
        assert "swaps for them: 1" in text, text
        base = re.search(r"curl -s (http://\S+)/chat/completions", text)
        assert base is not None, text

        body = json.dumps({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]})
        request = urllib.request.Request(
            f"{base.group(1)}/chat/completions", data=body.encode(),
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=120) as response:
            assert response.status == 200
            assert json.load(response)["choices"][0]["message"]["content"]

        # Run a second time while the first is up: harmless, and it says so.
        again = io.StringIO()
        assert demo.run_demo(state, out=again) == 0, again.getvalue()
        assert "the demo is already running" in again.getvalue(), again.getvalue()
        assert "kubectl apply" not in again.getvalue(), again.getvalue()
        assert f"{base.group(1)}/chat/completions" in again.getvalue(), again.getvalue()

        # The demo holds the node's one GPU: the examples applied in another namespace
        # cannot load, and their pool says why, naming the demo's pod that holds it.
        cluster = controlplane.healthy(state)
        assert cluster is not None
        kubectl = demo._kubectl(cluster)
        kubectl("create", "namespace", "second-pool")
        harness.apply_examples(kubectl, "second-pool")
        holder = harness.list_pods(kubectl, "modelpool-demo", harness.LABEL_SERVER)
        [held] = [p.name for p in holder if not p.terminating]

        def refused() -> str | None:
            obj = harness.get(kubectl, "second-pool", f"modelpools.{harness.GROUP}", "gpu0")
            return demo.unschedulable_message(obj)

        message = harness.eventually(refused, "the second pool to say it is unschedulable")
        assert "Insufficient nvidia.com/gpu" in message, message
        assert f"nvidia.com/gpu is held by modelpool-demo/{held} on " in message, message
        # The Event is posted beside the status write, not before it: waited for.
        events = harness.eventually(
            lambda: kubectl.json("get", "events", "-n", "second-pool", "--field-selector",
                                 "involvedObject.name=gpu0,reason=Unschedulable")["items"]
            or None,
            "the second pool's Unschedulable Event")
        assert [e["type"] for e in events] == ["Warning"], events
    finally:
        controlplane.down(state)


@pytest.mark.timeout(300)
def test_the_demo_says_why_its_pool_cannot_load_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No GPU on the node: the demo's member stays Pending; the demo prints the pool's
    Unschedulable message as it appears, and fails after its wait instead of hanging."""
    state = tmp_path / "no-gpu-cluster"
    out = io.StringIO()
    try:
        assert demo.run_demo(state, out=out, gpus=0, wait=30.0) == 1, out.getvalue()
        text = out.getvalue()
        assert re.search(r"pool\s+Unschedulable: gemma cannot be scheduled: .*Insufficient "
                         r"nvidia\.com/gpu", text), text
        err = capsys.readouterr().err
        assert "pool modelpool-demo/gpu0 cannot load after 30s: gemma cannot be scheduled" \
            in err, err
    finally:
        controlplane.down(state)
