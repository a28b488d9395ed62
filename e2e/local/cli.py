"""`modelpool-local`: a real Kubernetes control plane and a local node, without Docker.

    modelpool-local up [--gpus N] [--state-dir D] [--no-node] [--restart-node]
                       # prints the kubeconfig path as its last line
    modelpool-local status [--state-dir D]
    modelpool-local down [--state-dir D]
    modelpool-local demo [--state-dir D]  # up, install examples/, narrate a swap (e2e.local.demo)

The entry point: the only place that reads the environment (for the default state
directory) and configures logging. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from e2e.local import controlplane, demo
from e2e.local.paths import default_state_dir


def _parser(default_dir: Path) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelpool-local", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument(
        "--state-dir", type=Path, default=default_dir, help=f"default: {default_dir}"
    )
    up = commands.add_parser("up", parents=[state], help="start the cluster (idempotent)")
    up.add_argument("--gpus", type=int, default=1, help="fake nvidia.com/gpu on the node")
    up.add_argument("--no-node", action="store_true", help="start no node agent")
    up.add_argument(
        "--restart-node", action="store_true", help="restart a running node agent (new code)"
    )
    up.add_argument("--bin-dir", type=Path, help="control-plane binaries (default: build)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to become healthy")
    commands.add_parser("down", parents=[state], help="stop everything and remove the state")
    commands.add_parser("status", parents=[state], help="say what runs")
    demo.add_parser(commands, [state])
    return parser


def _up(args: argparse.Namespace) -> int:
    if args.gpus < 0:
        print("--gpus must be 0 or more", file=sys.stderr)
        return 2
    start = time.monotonic()
    options = controlplane.UpOptions(
        state_dir=args.state_dir,
        python=sys.executable,
        gpus=args.gpus,
        with_node=not args.no_node,
        bin_dir=args.bin_dir,
        timeout=args.timeout,
        restart_node=args.restart_node,
    )
    try:
        cluster = controlplane.up(options)
    except controlplane.ClusterError as e:
        print(f"modelpool-local up failed: {e}", file=sys.stderr)
        return 1
    print(f"cluster up in {time.monotonic() - start:.1f}s; state in {cluster.state_dir}",
          file=sys.stderr)
    print(cluster.kubeconfig)
    return 0


def _status(args: argparse.Namespace) -> int:
    parts = controlplane.status(args.state_dir)
    if not parts:
        print(f"no cluster in {args.state_dir}")
        return 1
    for part in parts:
        print(f"{part.name:<24} {'running, pid ' + str(part.pid) if part.pid else 'stopped'}")
    cluster = controlplane.healthy(args.state_dir)
    if cluster is None:
        print("cluster: not healthy")
        return 1
    print(f"cluster: healthy, API server {cluster.settings.server}")
    print(f"kubeconfig: {cluster.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    if not controlplane.down(args.state_dir):
        print(f"no cluster in {args.state_dir}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="[modelpool-local %(asctime)s] %(message)s", datefmt="%H:%M:%S"
    )
    args = _parser(default_state_dir(os.environ, Path.home())).parse_args(argv)
    handlers = {"up": _up, "down": _down, "status": _status, "demo": demo.main}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
