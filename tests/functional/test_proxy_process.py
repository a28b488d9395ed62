"""The router as a real process (`sidecar.__main__.serve` behind the stand-in
activator): SIGTERM answers held requests 503 with Retry-After and lets in-flight
streams finish; config reload keeps streams alive; /metrics over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.fake_model.harness import free_port
from tests.functional.proxy_support import FakeUpstream, config_json, serve_app, url_backend
from tests.functional.test_proxy import ROUTER_FAMILIES

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
STANDIN = "tests.functional.standin_router"
# The real Activation against an in-memory API server where coder is resident and a
# request for gemma is never served.
FAKE_KUBE = "tests.functional.standin_router --fake-kube"
# The real entry point with the real Activation (url backends need no cluster).
REAL = "sidecar"
# The stand-in with an API keys file holding `first-key`.
WITH_KEYS = "tests.functional.standin_router "
# The stand-in whose activation fails half a second after start.
CRASH = "tests.functional.standin_router --crash-activation"
# Per mode: the model whose requests stay held, and a model served at once.
HELD_MODEL = {STANDIN: "held", FAKE_KUBE: "gemma"}
SERVED_MODEL = {STANDIN: "alpha", FAKE_KUBE: "coder"}


@dataclass
class RouterProcess:
    process: asyncio.subprocess.Process
    mode: str
    url: str
    metrics_url: str
    config_path: Path
    log_path: Path
    upstream_url: str
    upstream: FakeUpstream

    def log(self) -> str:
        return self.log_path.read_text()


def _write_atomically(path: Path, raw: dict[str, Any] | str) -> None:
    # As the kubelet does: a new file, then a rename over the old one.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    tmp.replace(path)


def _config(upstream_url: str, *extra: dict[str, Any], pooled: bool = False) -> dict[str, Any]:
    def member(name: str) -> dict[str, Any]:
        return {
            **url_backend(name, ""),
            "url": None,
            "service": name,
            "modelServer": name,
            "pool": "heavy",
        }

    if not pooled:
        return config_json(
            [
                url_backend("alpha", upstream_url),
                url_backend("held", upstream_url, pool="heavy"),
                *extra,
            ]
        )
    return config_json(
        [url_backend("alpha", upstream_url), member("coder"), member("gemma"), *extra],
        pools=[
            {
                "name": "heavy",
                "members": ["coder", "gemma"],
                "default": "coder",
                "swapPolicy": "sticky",
                "swapBudgetSeconds": 300,
                "maxWaitSeconds": None,
                "minResidencySeconds": 0,
            }
        ],
    )


async def _until(what: str, check: Any, limit: float = 20.0) -> None:
    try:
        async with asyncio.timeout(limit):
            while True:
                if await check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"timed out waiting until {what}")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _spawn(
    args: list[str], tmp_path: Path, config_path: Path, shutdown_delay: float = 0.0
) -> tuple[asyncio.subprocess.Process, int, int, Path]:
    """`python -m ARGS` as a router on free ports; its output goes to router.log. Its
    SIGTERM goes straight to shutting down unless given a `shutdown_delay`."""
    port, metrics_port = free_port(HOST), free_port(HOST)
    log_path = tmp_path / "router.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELPOOL_")}
    env["MODELPOOL_BIND_HOST"] = HOST
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *args,
            "--config",
            str(config_path),
            "--host",
            "203.0.113.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--shutdown-grace",
            "15",
            "--shutdown-delay",
            str(shutdown_delay),
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=log,
        )
    return process, port, metrics_port, log_path


@pytest.fixture
async def router(
    request: pytest.FixtureRequest, tmp_path: Path, http: aiohttp.ClientSession
) -> AsyncIterator[RouterProcess]:
    module = getattr(request, "param", STANDIN)
    upstream = FakeUpstream()
    async with serve_app(upstream.app()) as upstream_url:
        config_path = tmp_path / "config.json"
        _write_atomically(config_path, _config(upstream_url, pooled=module == FAKE_KUBE))
        args = module.split()
        if module == WITH_KEYS:
            _write_atomically(tmp_path / "keys", "first-key\n")
            args += ["--api-keys-file", str(tmp_path / "keys")]
        process, port, metrics_port, log_path = await _spawn(args, tmp_path, config_path)
        proc = RouterProcess(
            process,
            module,
            f"http://{HOST}:{port}",
            f"http://{HOST}:{metrics_port}",
            config_path,
            log_path,
            upstream_url,
            upstream,
        )

        async def healthy() -> bool:
            assert process.returncode is None, proc.log()
            try:
                async with http.get(proc.metrics_url + "/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientConnectionError:
                return False

        try:
            await _until("the router serves", healthy)
            yield proc
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def _metric(
    http: aiohttp.ClientSession, router: RouterProcess, name: str, **labels: str
) -> float:
    async with http.get(router.metrics_url + "/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def _read_stream(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    first: asyncio.Event,
    chunks: list[bytes] | None = None,
) -> tuple[int, list[bytes]]:
    """Read a stream into `chunks` (the caller may watch it grow)."""
    chunks = [] if chunks is None else chunks
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        async for chunk, _ in resp.content.iter_chunks():
            chunks.append(chunk)
            first.set()
        return resp.status, chunks


def _events(chunks: list[bytes]) -> list[str]:
    return [e for e in b"".join(chunks).decode().split("\n\n") if e]


@pytest.mark.parametrize("router", [STANDIN, FAKE_KUBE], indirect=True)
async def test_sigterm_answers_held_with_503_and_finishes_in_flight(
    router: RouterProcess, http: aiohttp.ClientSession
) -> None:
    streaming = asyncio.Event()
    received: list[bytes] = []
    stream = asyncio.create_task(
        _read_stream(
            http,
            router.url,
            {"model": SERVED_MODEL[router.mode], "stream": True, "x_until_released": True},
            streaming,
            received,
        )
    )
    held = asyncio.create_task(
        http.post(router.url + "/v1/chat/completions", json={"model": HELD_MODEL[router.mode]})
    )
    await streaming.wait()

    async def is_held() -> bool:
        return (
            await _metric(http, router, "modelpool_held_requests", member=HELD_MODEL[router.mode])
            == 1
        )

    await _until("a request is held", is_held)
    router.process.send_signal(signal.SIGTERM)

    async with asyncio.timeout(10):
        held_response = await held
    assert held_response.status == 503
    assert held_response.headers["Retry-After"] == "1"
    assert (await held_response.json())["error"]["code"] == "shutting_down"
    assert not stream.done(), "the held request must be answered while the stream still runs"

    # No new connections once shutting down.
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh:
            await fresh.post(router.url + "/v1/chat/completions", json={"model": "alpha"})

    # The stream keeps flowing while the router drains.
    so_far = len(received)

    async def still_flowing() -> bool:
        return len(received) >= so_far + 3

    await _until("the in-flight stream goes on after SIGTERM", still_flowing)
    router.upstream.release.set()
    status, chunks = await stream
    assert status == 200
    events = _events(chunks)
    assert len(events) >= 3 and events[-1] == "data: [DONE]"
    assert await asyncio.wait_for(router.process.wait(), 20) == 0, router.log()


async def test_sigterm_goes_on_serving_for_the_delay_each_connection_closed_after_its_answer(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """While the Service's endpoints drop a terminating pod, new connections still arrive:
    for `--shutdown-delay` the router is not ready but answers them, and every answer
    closes its connection, so a keep-alive client reconnects (to another replica). A second
    SIGTERM ends the delay; then no connection is accepted."""
    upstream = FakeUpstream()
    async with serve_app(upstream.app()) as upstream_url:
        config_path = tmp_path / "config.json"
        _write_atomically(config_path, _config(upstream_url))
        process, port, metrics_port, log_path = await _spawn(
            [STANDIN], tmp_path, config_path, shutdown_delay=600)
        url, metrics_url = f"http://{HOST}:{port}", f"http://{HOST}:{metrics_port}"
        try:
            async def ready_is(status: int) -> bool:
                assert process.returncode is None, log_path.read_text()
                try:
                    async with http.get(metrics_url + "/readyz") as resp:
                        return resp.status == status
                except aiohttp.ClientConnectionError:
                    return False

            await _until("the router serves", lambda: ready_is(200))
            alpha = {"model": "alpha", "messages": []}
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1)
            ) as kept:
                async with kept.post(url + "/v1/chat/completions", json=alpha) as resp:
                    assert resp.status == 200
                    assert resp.headers.get("Connection", "keep-alive") != "close"
                    await resp.read()
                process.send_signal(signal.SIGTERM)
                await _until("the router is not ready", lambda: ready_is(503))
                # the connection kept from before, and then a new one
                for _ in range(2):
                    async with kept.post(url + "/v1/chat/completions", json=alpha) as resp:
                        assert resp.status == 200
                        assert resp.headers["Connection"] == "close"
                        await resp.read()
            assert process.returncode is None
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 20) == 0, log_path.read_text()
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as fresh:
                    await fresh.post(url + "/v1/chat/completions", json=alpha)
            assert "accepting for 600s more while the endpoints drop this pod" in (
                log_path.read_text())
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_config_reload_keeps_in_flight_stream_and_rejects_bad_config(
    router: RouterProcess, http: aiohttp.ClientSession
) -> None:
    streaming = asyncio.Event()
    stream = asyncio.create_task(
        _read_stream(
            http,
            router.url,
            {"model": "alpha", "stream": True, "x_until_released": True},
            streaming,
        )
    )
    await streaming.wait()
    _write_atomically(
        router.config_path, _config(router.upstream_url, url_backend("gamma", router.upstream_url))
    )

    async def gamma_listed() -> bool:
        async with http.get(router.url + "/v1/models") as resp:
            return "gamma" in {m["id"] for m in (await resp.json())["data"]}

    await _until("the new config is live", gamma_listed)
    assert not stream.done(), "the reload must happen while the stream runs"
    async with http.post(router.url + "/v1/completions", json={"model": "gamma"}) as resp:
        assert resp.status == 200

    # A broken config keeps the current one.
    _write_atomically(router.config_path, '{"router": ')

    async def error_logged() -> bool:
        return "keeping the previous" in router.log()

    await _until("the bad config is reported", error_logged)
    async with http.post(router.url + "/v1/completions", json={"model": "gamma"}) as resp:
        assert resp.status == 200

    router.upstream.release.set()
    status, chunks = await stream
    assert status == 200
    events = _events(chunks)
    assert len(events) >= 3 and events[-1] == "data: [DONE]"


@pytest.mark.parametrize("router", [REAL, STANDIN], indirect=True)
async def test_metrics_over_http_have_every_family_and_binds_to_bind_host(
    router: RouterProcess, http: aiohttp.ClientSession
) -> None:
    # --host said 203.0.113.1: MODELPOOL_BIND_HOST won, or the fixture could not connect.
    async with http.post(router.url + "/v1/chat/completions", json={"model": "alpha"}) as resp:
        assert resp.status == 200
    async with http.post(router.url + "/v1/chat/completions", json={"model": "zzz"}) as resp:
        assert resp.status == 404
    async with http.get(router.metrics_url + "/metrics") as resp:
        families = {f.name for f in text_string_to_metric_families(await resp.text())}
    assert families >= ROUTER_FAMILIES
    assert await _metric(http, router, "modelpool_requests_total", model="alpha", code="200") == 1
    assert await _metric(http, router, "modelpool_requests_total", model="unknown", code="404") == 1
    lines = [json.loads(line) for line in router.log().splitlines() if line.strip()]
    assert any("serving on" in entry["message"] for entry in lines), "logs are JSON lines"
    router.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(router.process.wait(), 20) == 0, router.log()


async def test_a_failing_part_takes_the_process_down(tmp_path: Path) -> None:
    config_path = tmp_path / "config.json"
    _write_atomically(config_path, _config("http://127.0.0.1:9"))
    process, *_, log_path = await _spawn(CRASH.split(), tmp_path, config_path)
    assert await asyncio.wait_for(process.wait(), 30) == 1
    assert "activation broke" in log_path.read_text()


async def test_a_bad_config_at_start_exits_2(tmp_path: Path) -> None:
    config_path = tmp_path / "config.json"
    _write_atomically(config_path, {"router": {}})
    process, *_, log_path = await _spawn([REAL], tmp_path, config_path)
    assert await asyncio.wait_for(process.wait(), 30) == 2
    assert "config.backends is required" in log_path.read_text()


@pytest.mark.parametrize("router", [WITH_KEYS], indirect=True)
async def test_api_keys_file_is_reloaded(
    router: RouterProcess, http: aiohttp.ClientSession
) -> None:
    async def status(key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        async with http.get(router.url + "/v1/models", headers=headers) as resp:
            return resp.status

    assert await status("first-key") == 200
    assert await status("second-key") == 401
    _write_atomically(router.config_path.parent / "keys", "second-key\n")

    async def rotated() -> bool:
        return await status("second-key") == 200

    await _until("the new key is accepted", rotated)
    assert await status("first-key") == 401
