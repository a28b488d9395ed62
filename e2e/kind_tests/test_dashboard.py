"""The Grafana dashboard (overlays/production/grafana/modelpool.json) judged by a real
Prometheus (built from the Go module proxy by e2e/prometheus/build.sh) scraping the kind
cluster's reconciler and router: after a scripted session (a deferred swap there and back,
requests held through it, a 503, an idle unload) every query of every panel, evaluated
over the session as a Grafana panel asks for it, has a value above 0. (A series that
appeared only at its first event would show 0 there: both processes start their series at
0.) Prometheus scrapes as the production overlay's ServiceMonitor and PodMonitor say: the
reconciler with its own labels kept (its `namespace` is the pool's), each router with its
pod's namespace. Grafana's variables are given what a user would pick: the test's
namespace and pool, and the window $__rate_interval comes to at a 1 s scrape.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from e2e import dashboard_svg, harness
from e2e.fake_model.harness import free_port
from e2e.harness import Json
from e2e.local.fixtures import Kubectl
from e2e.local.paths import REPO_ROOT

pytestmark = [pytest.mark.timeout(900), pytest.mark.build("prometheus")]

DASHBOARD = REPO_ROOT / "overlays" / "production" / "grafana" / "modelpool.json"
BUILD = REPO_ROOT / "e2e" / "prometheus" / "build.sh"
HELLO: Any = [{"role": "user", "content": "hello"}]
# What Grafana's $__rate_interval comes to at a 1 s scrape and a 2 s step, with room
RATE_INTERVAL = "15s"
Points = list[tuple[float, float]]


def prometheus_binary() -> Path:
    """The binary e2e/prometheus/build.sh made (scripts/test builds it; warm, it only
    prints the path)."""
    result = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True,
                            timeout=1800, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def query_range(base: str, expr: str, start: float, end: float) -> list[tuple[Json, Points]]:
    """Each series of `expr` over [start, end] at a 2 s step, as a Grafana time series
    panel asks for it: its labels and its finite points."""
    url = f"{base}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "2"})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return [(series["metric"], [(float(t), float(v)) for t, v in series["values"]
                                if math.isfinite(float(v))])
            for series in body["data"]["result"]]


def legend(template: str, labels: Json) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(labels.get(m.group(1), "")), template)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running Prometheus with an empty target list, and its file_sd file to fill."""
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            # the reconciler: as the ServiceMonitor with honorLabels: true
            {"job_name": "modelpool-reconciler", "honor_labels": True,
             "file_sd_configs": [{"files": [str(tmp_path / "reconciler.json")],
                                  "refresh_interval": "1s"}]},
            # the routers: as the PodMonitor, `namespace` from the target
            {"job_name": "modelpool-routers",
             "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]},
        ],
    }
    (tmp_path / "reconciler.json").write_text("[]")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [str(prometheus_binary()), f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool | None:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                return True if r.status == 200 else None
        except OSError:
            return None

    try:
        harness.eventually(up, "Prometheus ready", 60,
                           explain=lambda: (tmp_path / "prometheus.log").read_text()[-2000:])
        yield base, tmp_path
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def panel_queries(namespace: str) -> list[tuple[Json, Json, str]]:
    """(panel, target, query) for every target of every panel, Grafana's variables filled
    in."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = (target["expr"].replace("$namespace", namespace).replace("$pool", "slot")
                    .replace("$__rate_interval", RATE_INTERVAL))
            assert "$" not in expr, (panel["title"], expr)
            found.append((panel, target, expr))
    return found


def picture(base: str, namespace: str, start: float, end: float) -> str:
    """The dashboard drawn from what Prometheus answers for its panels (docs/dashboard.svg)."""
    series: dict[int, list[dashboard_svg.Series]] = {}
    grids: dict[int, tuple[str, tuple[int, int, int, int]]] = {}
    for panel, target, expr in panel_queries(namespace):
        grid = panel["gridPos"]
        grids[panel["id"]] = (panel["title"], (grid["x"], grid["y"], grid["w"], grid["h"]))
        for labels, points in query_range(base, expr, start, end):
            series.setdefault(panel["id"], []).append(
                dashboard_svg.Series(legend(target["legendFormat"], labels), points))
    panels = [dashboard_svg.Panel(title, grid, series.get(id_, []))
              for id_, (title, grid) in grids.items()]
    return dashboard_svg.render("modelpool (a scripted session on kind)", panels, start, end)


def test_every_panel_of_the_dashboard_has_data_after_a_scripted_session(
    kind_kubectl: Kubectl, restricted_namespace: str, prometheus: tuple[str, Path],
) -> None:
    ns, kubectl = restricted_namespace, kind_kubectl
    base, sd = prometheus
    harness.apply(
        kubectl, ns,
        harness.fake_member("a", load_time=0.5), harness.fake_member("b", load_time=1.0),
        harness.fake_member("broken", env={"FAKE_MODEL_FAIL_LOAD": "1"}),
        harness.pool("slot", ["a", "b", "broken"], default="a", swap_budget="30s",
                     idleUnloadAfter="6s"),
        harness.router("chat", ["a", "b", "broken"]))
    (router,) = harness.wait_router_ready(kubectl, ns, "chat", None, 180.0)
    # the default a loaded once; with idleUnloadAfter 6 s it may be unloaded again by the
    # time its router is Ready (the first request below loads it again)
    harness.eventually(
        lambda: True if ((harness.pool_status(kubectl, ns, "slot").get("lastSwap") or {})
                         .get("outcome") == "Succeeded") else None,
        "the pool's default a loaded once", 120.0)
    reconciler = harness.reconciler_pod(kubectl, harness.Installation(harness.RECONCILER, None))
    (sd / "reconciler.json").write_text(json.dumps(
        [{"targets": [f"{reconciler.ip}:9090"]}]))
    (sd / "targets.json").write_text(json.dumps(
        [{"targets": [f"{router.ip}:9090"], "labels": {"namespace": ns, "pod": router.name}}]))

    def scraped() -> bool | None:
        up = query(base, "up")
        return True if len(up) == 2 and all(s["value"][1] == "1" for s in up) else None

    harness.eventually(scraped, "both targets scraped", 60,
                       explain=lambda: query(base, "up"))

    session_start = time.time()
    with openai.OpenAI(base_url=harness.base_url(router), api_key="unused", max_retries=0,
                       timeout=120) as client:
        # a answers first: it may have gone idle and been unloaded (idleUnloadAfter 6 s)
        # while the targets were being scraped, and this loads it again
        assert client.chat.completions.create(model="a", messages=HELLO,
                                              max_tokens=2).model == "a"
        # b asked for while a streams: the swap is deferred (PodsBusy), b's request held.
        # The stream is long (60 s at 50 tokens/s) so that a loaded host cannot end it before
        # the deferral is seen; hanging up on it then leaves a idle and lets the swap go on.
        with client.chat.completions.create(model="a", messages=HELLO, max_tokens=3000,
                                            stream=True) as chunks:
            next(iter(chunks))
            outcome: list[object] = []

            def ask_for_b() -> None:
                try:
                    outcome.append(client.chat.completions.create(
                        model="b", messages=HELLO, max_tokens=2).model)
                except openai.OpenAIError as e:
                    outcome.append(e)

            swap = threading.Thread(target=ask_for_b)
            swap.start()

            def deferred() -> bool | None:
                found = harness.condition(harness.get(kubectl, ns, "modelpool", "slot"),
                                          "SwapDeferred")
                return True if found and found["status"] == "True" else None

            harness.eventually(deferred, "the swap deferred while a streams", 60,
                               explain=lambda: (outcome, harness.pool_status(kubectl, ns, "slot")))

            def held_scraped() -> bool | None:
                held = query(base, f'modelpool_held_requests{{namespace="{ns}"}} > 0')
                return True if held else None

            harness.eventually(held_scraped, "b's held request scraped", 60,
                               explain=lambda: query(
                                   base, f'modelpool_held_requests{{namespace="{ns}"}}'))
        swap.join(120)
        assert outcome == ["b"]
        # and back, twice, the first answer scraped before the second: a rate needs two
        # samples of a counter (the stream was hung up on, so it counts under 499)
        answered_a = f'modelpool_requests_total{{namespace="{ns}", model="a", code="200"}}'
        for times in (2, 3):  # the first answer of the session is the first
            reply = client.chat.completions.create(model="a", messages=HELLO, max_tokens=2)
            assert reply.model == "a"

            def scraped_as(count: int = times) -> bool | None:
                return True if [s for s in query(base, answered_a)
                                if s["value"][1] == str(count)] else None

            harness.eventually(scraped_as, f"a's answer {times} scraped", 30,
                               explain=lambda: query(base, answered_a))
        # A member that never loads, given up at the budget: 10 s is enough for that, and
        # the 30 s above are for the deferral (the budget is read at every step of a swap).
        kubectl("patch", "modelpool", "slot", "-n", ns, "--type=merge",
                "-p", '{"spec": {"swapBudget": "10s"}}')
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="broken", messages=HELLO, max_tokens=2)
        assert refused.value.status_code == 503
    harness.wait_pool_ready(kubectl, ns, "slot", "a", 60.0)  # the failed swap left it usable

    def cold() -> bool | None:
        status = harness.pool_status(kubectl, ns, "slot")
        return True if status.get("phase") == "Cold" else None

    harness.eventually(cold, "the pool Cold after 6 s idle", 90,
                       explain=lambda: harness.pool_status(kubectl, ns, "slot"))

    empty: dict[str, str] = {}

    def every_panel_has_numbers() -> bool | None:
        empty.clear()
        for panel, _, expr in panel_queries(ns):
            found = query_range(base, expr, session_start, time.time())
            if not any(v > 0 for _, points in found for _, v in points):
                empty[panel["title"]] = expr
        return True if not empty else None

    harness.eventually(every_panel_has_numbers,
                       "a number above 0 in every panel's every query", 60,
                       explain=lambda: (empty, query(
                           base, f'modelpool_requests_total{{namespace="{ns}"}}')))
    # and what they show is this session: the resident now is nobody (Cold), a swap b -> a
    swaps = query(base, f'sum by (from, to) (modelpool_swaps_total{{namespace="{ns}"}})')
    assert {(s["metric"].get("from"), s["metric"].get("to")) for s in swaps
            if float(s["value"][1]) > 0} >= {
        ("a", "b"), ("b", "a")}, swaps
    errors = query(base, f'sum by (reason) (modelpool_errors_total{{namespace="{ns}"}})')
    assert {s["metric"]["reason"] for s in errors if float(s["value"][1]) > 0} & {
        "swap_abandoned", "swap_budget_exceeded"}, errors
    unloads = query(base, f'modelpool_idle_unloads_total{{namespace="{ns}"}}')
    assert [s["metric"]["member"] for s in unloads if float(s["value"][1]) > 0] == ["a"], unloads
    target = os.environ.get("MODELPOOL_DASHBOARD_SVG")
    if target:  # the README's picture: MODELPOOL_DASHBOARD_SVG=docs/dashboard.svg
        Path(target).write_text(picture(base, ns, session_start, time.time()))


def test_the_dashboard_is_shipped_as_a_configmap_the_grafana_sidecar_loads() -> None:
    """`kubectl kustomize overlays/production` carries the dashboard, byte for byte, in a
    ConfigMap labelled grafana_dashboard=1; every panel queries through the data source
    variable."""
    built = subprocess.run(["kubectl", "kustomize", str(REPO_ROOT / "overlays" / "production")],
                           stdout=subprocess.PIPE, text=True, check=True, timeout=60).stdout
    (config_map,) = [o for o in yaml.safe_load_all(built)
                     if o and o["kind"] == "ConfigMap"
                     and o["metadata"]["name"] == "modelpool-grafana-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"]["modelpool.json"] == DASHBOARD.read_text()
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
