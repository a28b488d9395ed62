"""Entry point: `python -m e2e.local.node_agent --kubeconfig FILE --node-name NAME
--gpus N --state-dir DIR`. Builds the settings (the only place that reads the
environment) and runs the agent until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import aiohttp
import yaml

from e2e.local.node_agent import logs
from e2e.local.node_agent.agent import Agent
from e2e.local.node_agent.kube import Kube
from e2e.local.node_agent.settings import AgentSettings, api_server_from_kubeconfig

logger = logging.getLogger("e2e.local.node_agent")

# The project's root: the programs the agent runs are modules of this checkout.
PROJECT_ROOT = Path(__file__).resolve().parents[3]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m e2e.local.node_agent")
    parser.add_argument("--kubeconfig", required=True, help="an admin kubeconfig")
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--gpus", type=int, default=1, help="fake nvidia.com/gpu devices")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--cpu", default="8")
    parser.add_argument("--memory", default="32Gi")
    parser.add_argument("--max-pods", type=int, default=110)
    parser.add_argument("--pod-network", default="127.0.0.0/16",
                        help="pod addresses are taken from here (never 127.0.0.1)")
    parser.add_argument("--unschedulable", action="store_true",
                        help="register the node cordoned (pods must name it in nodeName)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def build_settings(args: argparse.Namespace) -> AgentSettings:
    kubeconfig = Path(args.kubeconfig).resolve()
    config = yaml.safe_load(kubeconfig.read_text())
    pythonpath = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONPATH": pythonpath,
        "PYTHONUNBUFFERED": "1",
    }
    return AgentSettings(
        kubeconfig=str(kubeconfig),
        node_name=args.node_name,
        gpus=args.gpus,
        state_dir=Path(args.state_dir).resolve(),
        python=sys.executable,
        api_server=api_server_from_kubeconfig(config, kubeconfig.parent),
        base_env=base_env,
        cpu=args.cpu,
        memory=args.memory,
        max_pods=args.max_pods,
        pod_network=args.pod_network,
        unschedulable=args.unschedulable,
    )


async def serve(settings: AgentSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    kube = await Kube.connect(settings.kubeconfig)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await Agent(settings, kube, session).run(stop)
    logger.info("node agent stopped")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logs.configure(getattr(logging, str(args.log_level).upper(), logging.INFO))
    asyncio.run(serve(build_settings(args)))


if __name__ == "__main__":
    main()
