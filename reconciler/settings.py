"""The reconciler's settings: one tree of frozen dataclasses, built once at the entry point.

Nothing below `reconciler.__main__` reads flags or the environment; every part is handed
the piece of this tree it needs.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from reconciler.spec import DEFAULT_ROUTER_IMAGE


@dataclass(frozen=True)
class LeaderSettings:
    enabled: bool = False
    namespace: str = "modelpool-system"
    name: str = "modelpool-reconciler"
    identity: str = "modelpool-reconciler"  # the pod name in a cluster
    lease_seconds: float = 15.0
    renew_seconds: float = 5.0
    retry_seconds: float = 2.0


@dataclass(frozen=True)
class SwapSettings:
    # How often a deferred swap asks the incumbent again whether it is idle.
    probe_interval_seconds: float = 2.0
    probe_timeout_seconds: float = 3.0
    # A ModelServer in no pool waits this long after its creation before it is started, so
    # that a pool applied together with it claims it first.
    standalone_settle_seconds: float = 3.0


@dataclass(frozen=True)
class Settings:
    namespace: str | None = None  # None: every namespace
    kubeconfig: str | None = None
    bind_host: str = "0.0.0.0"
    metrics_port: int = 9090
    workers: int = 4
    log_level: str = "INFO"
    # A rendered Deployment whose pods cannot be created (Pod Security, a quota) has its
    # ReplicaSet retried this often, instead of on the ReplicaSet controller's own
    # exponential backoff, which reaches minutes (`Controller._retry_creation`).
    create_retry_seconds: float = 10.0
    # What every router runs unless its spec.proxy.image says otherwise: the base sets it
    # to the reconciler's own image, so one kustomize `images:` entry moves both.
    router_image: str = DEFAULT_ROUTER_IMAGE
    leader: LeaderSettings = field(default_factory=LeaderSettings)
    swap: SwapSettings = field(default_factory=SwapSettings)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", default=None, help="watch one namespace (default: all)")
    p.add_argument("--leader-elect", action="store_true", help="elect a leader on a Lease")
    p.add_argument("--metrics-port", type=int, default=9090, help="metrics and health port")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster)")
    p.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    p.add_argument("--probe-interval", type=float, default=2.0,
                   help="seconds between idle probes of a busy incumbent")
    p.add_argument("--lease-namespace", default=None,
                   help="namespace of the leader Lease (default: POD_NAMESPACE or "
                        "modelpool-system)")
    p.add_argument("--lease-duration", type=float, default=15.0,
                   help="seconds a leader's Lease lasts unrenewed (renewed every third)")
    p.add_argument("--create-retry", type=float, default=10.0,
                   help="seconds between retries of a Deployment whose pods cannot be created")
    p.add_argument("--router-image", default=None,
                   help="image of the routers whose spec.proxy.image is unset (default: "
                        f"MODELPOOL_ROUTER_IMAGE, else {DEFAULT_ROUTER_IMAGE})")
    p.add_argument("--log-level", default="INFO")


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    identity = environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    lease_namespace = (
        args.lease_namespace or environ.get("POD_NAMESPACE") or LeaderSettings.namespace
    )
    return Settings(
        namespace=args.namespace,
        kubeconfig=args.kubeconfig or environ.get("KUBECONFIG") or None,
        bind_host=environ.get("MODELPOOL_BIND_HOST") or "0.0.0.0",
        metrics_port=args.metrics_port,
        workers=max(1, args.workers),
        log_level=args.log_level,
        create_retry_seconds=max(1.0, args.create_retry),
        router_image=(args.router_image or environ.get("MODELPOOL_ROUTER_IMAGE")
                      or DEFAULT_ROUTER_IMAGE),
        leader=LeaderSettings(
            enabled=args.leader_elect,
            namespace=lease_namespace,
            identity=identity,
            lease_seconds=args.lease_duration,
            renew_seconds=args.lease_duration / 3,
            retry_seconds=min(2.0, args.lease_duration / 5),
        ),
        swap=SwapSettings(probe_interval_seconds=args.probe_interval),
    )


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    p = argparse.ArgumentParser(prog="modelpool-reconciler run")
    add_run_arguments(p)
    return from_args(p.parse_args(argv), environ)
