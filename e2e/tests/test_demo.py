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

from e2e.local import controlplane, demo


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
    finally:
        controlplane.down(state)
