"""The router process's settings: built once at the entry point from flags and environment.

The router config (backends, pools, limits) is separate: it comes from the ConfigMap and
may change at run time; these settings are fixed for the life of the process.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ListenSettings:
    host: str
    port: int
    metrics_port: int


@dataclass(frozen=True)
class Settings:
    config_path: Path
    # The ConfigMap `config_path` is mounted from: followed through the API when set.
    config_map: str | None
    api_keys_file: Path | None
    listen: ListenSettings
    kubeconfig: str | None
    shutdown_grace_seconds: float
    # After SIGTERM: not ready, still serving, while the Service's endpoints drop the pod.
    shutdown_delay_seconds: float
    # Who this router is in `status.request.requestedBy`: namespace/router/pod.
    pod_name: str
    log_level: str = "INFO"
    # In-cluster connects take milliseconds; past this the endpoint is gone. Generous, as a
    # loop busy releasing thousands of held requests at once reads its timers late.
    connect_timeout_seconds: float = 10.0
    reload_interval_seconds: float = 1.0
    # What a request held at shutdown is told: retry soon, another replica will take it.
    shutdown_retry_after_seconds: float = 1.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="modelpool-router",
        description="OpenAI-compatible router that activates pooled models on demand.",
    )
    p.add_argument("--config", required=True, type=Path, help="router config JSON")
    p.add_argument(
        "--config-map", default=None,
        help="the ConfigMap (in the config's namespace) that --config is mounted from: "
        "watched through the API, its key named as the file, so a new config applies at "
        "once rather than when the kubelet next refreshes the file")
    p.add_argument("--api-keys-file", type=Path, default=None, help="one API key per line")
    p.add_argument("--host", default="0.0.0.0", help="bind address (MODELPOOL_BIND_HOST wins)")
    p.add_argument("--port", type=int, default=8080, help="API port")
    p.add_argument("--metrics-port", type=int, default=9090, help="metrics and health port")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster)")
    p.add_argument(
        "--shutdown-delay", type=float, default=5.0,
        help="seconds to go on accepting after SIGTERM, not ready, each connection closed "
        "after its answer, while the Service's endpoints drop the pod (a second SIGTERM or "
        "SIGINT ends it)")
    p.add_argument("--shutdown-grace", type=float, default=25.0, help="seconds for in-flight")
    p.add_argument("--log-level", default="INFO")
    return p


def from_args(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    args = parser().parse_args(argv)
    return Settings(
        config_path=args.config,
        config_map=args.config_map or None,
        api_keys_file=args.api_keys_file,
        listen=ListenSettings(
            host=environ.get("MODELPOOL_BIND_HOST") or args.host,
            port=args.port,
            metrics_port=args.metrics_port,
        ),
        kubeconfig=args.kubeconfig or environ.get("KUBECONFIG") or None,
        shutdown_grace_seconds=args.shutdown_grace,
        shutdown_delay_seconds=args.shutdown_delay,
        pod_name=environ.get("POD_NAME") or environ.get("HOSTNAME") or socket.gethostname(),
        log_level=args.log_level,
    )
