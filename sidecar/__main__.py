"""Entry point of the router: `python -m sidecar` / `modelpool-router`.

Builds the settings from flags and environment, then runs, under one TaskGroup, the API
server, the metrics and health server, the config watchers (the router's ConfigMap through
the API with `--config-map`, else the config file; the API keys file) and the activator.
A part that stops unexpectedly takes the process down. SIGTERM makes the router not ready
at once and lets it go on serving for `--shutdown-delay` seconds, each connection closed
after its answer, while the Service's endpoints drop the pod (a second SIGTERM or SIGINT
ends the delay); then it stops accepting, answers held requests 503 with `Retry-After`,
lets in-flight ones finish within the grace period, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from sidecar import activation, dialects, kube
from sidecar.app import Activation, Live, make_app
from sidecar.auth import ApiKeys, load_keys, parse_keys
from sidecar.config import ConfigError, RouterConfig, load_config, parse_config
from sidecar.http.server import Server
from sidecar.metrics import RouterMetrics
from sidecar.reload import WatchedFile, follow, watch
from sidecar.settings import Settings, from_args
from telemetry.health import make_health_app
from telemetry.logs import configure_logging

logger = logging.getLogger("sidecar")

API_BACKLOG = 2048

ActivationFactory = Callable[[RouterConfig, RouterMetrics, Settings], Awaitable[Activation[Any]]]


async def real_activation(
    config: RouterConfig, metrics: RouterMetrics, settings: Settings
) -> Activation[Any]:
    client = None
    if any(b.service is not None for b in config.backends):
        client = await kube.connect(settings.kubeconfig)
    identity = f"{config.namespace}/{config.name}/{settings.pod_name}"
    return activation.Activation(config, client, metrics, identity=identity)


def config_from_bytes(content: bytes) -> RouterConfig:
    try:
        raw = json.loads(content)
    except ValueError as e:
        raise ConfigError(f"router config is not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError("router config must hold a JSON object")
    return parse_config(raw)


def keys_from_bytes(content: bytes) -> ApiKeys:
    return parse_keys(content.decode())


async def _supervised(name: str, work: Coroutine[Any, Any, None], stopping: asyncio.Event) -> None:
    await work
    if not stopping.is_set():
        raise RuntimeError(f"{name} stopped unexpectedly")


async def serve(settings: Settings, make_activation: ActivationFactory = real_activation) -> None:
    """Run the router until SIGTERM or SIGINT (returns) or until a part fails (raises)."""
    config = load_config(settings.config_path)
    keys = load_keys(settings.api_keys_file)
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, config.name)
    metrics.known(config)
    activation = await make_activation(config, metrics, settings)
    live = Live(config, keys)
    stopping, hurry = asyncio.Event(), asyncio.Event()

    def apply_config(new: RouterConfig) -> None:
        # The activator first: if it refuses the config, the routes stay as they were
        # (and the watcher's failure takes the process down rather than half-apply it).
        activation.update_config(new)
        live.apply_config(new)
        metrics.known(new)

    def apply_keys(new: ApiKeys) -> None:
        live.keys = new

    config_file = WatchedFile(settings.config_path, config_from_bytes, apply_config)
    watched: list[WatchedFile[Any]] = [config_file]
    if settings.api_keys_file is not None:
        watched.append(WatchedFile(settings.api_keys_file, keys_from_bytes, apply_keys))
    for w in watched:
        w.prime(w.path.read_bytes())
    config_map_client: kube.KubeClient | None = None
    if settings.config_map:
        # The API is the config's source after start: the mounted file lags it, and
        # polling both could apply an older config over a newer one.
        watched.remove(config_file)
        config_file.label = f"ConfigMap {config.namespace}/{settings.config_map}"
        config_map_client = await kube.connect(settings.kubeconfig)

    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (hurry if stopping.is_set() else stopping).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    listen = settings.listen
    api = make_app(live, activation, metrics, connect_timeout=settings.connect_timeout_seconds)
    # A client that leaves cancels its handler: a held request gives up its place.
    api_server = Server(api, max_body=api.max_body, errors=dialects.SERVER_ERRORS)
    # On its own port so probes and scrapes never queue behind model traffic; ready while
    # the router can route (the activator is ready and it is not shutting down).
    health = web.AppRunner(
        make_health_app(registry, lambda: activation.ready() and not stopping.is_set()),
        access_log=None,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            background = [
                tg.create_task(_supervised("activation", activation.run(), stopping)),
                tg.create_task(
                    _supervised(
                        "config watcher",
                        watch(watched, settings.reload_interval_seconds),
                        stopping,
                    )
                ),
            ]
            if config_map_client is not None and settings.config_map:
                events = config_map_client.watch_config_map(config.namespace,
                                                            settings.config_map)
                background.append(tg.create_task(_supervised(
                    "ConfigMap watcher",
                    follow(events, settings.config_path.name, config_file),
                    stopping,
                )))
            # Thousands of clients may connect at once (held during a swap).
            await api_server.start(listen.host, listen.port, backlog=API_BACKLOG)
            await health.setup()
            await web.TCPSite(health, listen.host, listen.metrics_port).start()
            logger.info(
                "router %s/%s serving on %s:%s, metrics on :%s",
                config.namespace,
                config.name,
                listen.host,
                listen.port,
                listen.metrics_port,
            )
            await stopping.wait()

            if settings.shutdown_delay_seconds > 0 and not hurry.is_set():
                # The kubelet's SIGTERM and the endpoints' update race: for a moment the
                # Service still sends new connections here, and refusing them would fail
                # requests a client cannot safely retry.
                logger.info(
                    "shutting down: not ready; accepting for %gs more while the endpoints "
                    "drop this pod, each connection closed after its answer",
                    settings.shutdown_delay_seconds,
                )
                api_server.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hurry.wait(), settings.shutdown_delay_seconds)
            logger.info("shutting down: no new connections, answering held requests")
            api_server.stop_accepting()
            await activation.shutdown(settings.shutdown_retry_after_seconds)
            # Waits for in-flight requests up to the grace period.
            await api_server.shutdown(settings.shutdown_grace_seconds)
            logger.info("in-flight requests done")
            for task in background:
                task.cancel()
    finally:
        await api_server.shutdown(0)
        api.close()
        if health.server is not None:  # set up and not yet cleaned up
            await health.cleanup()


def run(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` on uvloop: its event loop, transports and timers are C, so each proxied
    request costs the router less CPU than on asyncio's own loop (docs/benchmarks.md)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(work)


def main(
    argv: Sequence[str] | None = None, make_activation: ActivationFactory = real_activation
) -> None:
    """The console script. Exit codes: 0 after SIGTERM, 1 when a part failed, 2 for a bad
    config at start."""
    settings = from_args(sys.argv[1:] if argv is None else argv, os.environ)
    configure_logging(settings.log_level)
    try:
        run(serve(settings, make_activation))
    except ConfigError as e:
        logger.error("%s", e)
        sys.exit(2)
    except Exception:
        logger.exception("router failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
