"""A registry (distribution v3, e2e/registry/build.sh) on this machine, and kind's nodes
told to pull from it.

`running(binary, state_dir)` starts it on a free port of every address, storing into
`state_dir`, and yields a `Registry` once `/v2/` answers: pushed to as `localhost:PORT`
(the Docker engine pushes to a loopback registry over plain HTTP without being told), and
reached by kind's nodes through the gateway of their network. `mirror_on_nodes` writes, on
each node, the containerd hosts file (`/etc/containerd/certs.d/localhost:PORT/hosts.toml`,
read at every pull once e2e/kind/up.sh set `config_path`) that sends a pull of
`localhost:PORT/...` to that gateway; `unmirror_on_nodes` removes it.

The registry's access log (one JSON line per request, with the client's address) is
`Registry.log`: `pulls_from(addresses)` reads which manifests the nodes resolved.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e.fake_model.harness import free_port

CERTS_D = "/etc/containerd/certs.d"
START_WITHIN = 30.0


@dataclass(frozen=True)
class Registry:
    port: int
    log: Path

    @property
    def name(self) -> str:
        """The registry as image references name it."""
        return f"localhost:{self.port}"

    def pulls_from(self, addresses: Sequence[str]) -> list[str]:
        """The manifest paths the registry resolved (HEAD) or served (GET) with a 200 to
        clients at `addresses` (the nodes), in order. A node that already holds the
        content (the same image side-loaded) only resolves the name."""
        pulls = []
        for line in self.log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            remote = str(record.get("http.request.remoteaddr", "")).rsplit(":", 1)[0]
            uri = str(record.get("http.request.uri", "")).split("?", 1)[0]
            if (record.get("http.request.method") in ("GET", "HEAD") and "/manifests/" in uri
                    and record.get("http.response.status") == 200 and remote in addresses):
                pulls.append(uri)
        return pulls


def config(port: int, state_dir: Path) -> str:
    """The registry's configuration: filesystem storage, deletes allowed, JSON logs."""
    return json.dumps({
        "version": 0.1,
        "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(state_dir / "data")},
                    "delete": {"enabled": True}},
        "http": {"addr": f"0.0.0.0:{port}"},
    })


@contextmanager
def running(binary: Path, state_dir: Path) -> Iterator[Registry]:
    port = free_port("0.0.0.0")
    state_dir.mkdir(parents=True, exist_ok=True)
    config_file = state_dir / "config.yml"  # JSON is YAML
    config_file.write_text(config(port, state_dir))
    log = state_dir / "registry.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [str(binary), "serve", str(config_file)], stdout=sink, stderr=subprocess.STDOUT,
            # no trace exporter: nothing collects them here
            env={**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"})
    registry = Registry(port, log)
    try:
        _wait_answering(registry, process)
        yield registry
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_answering(registry: Registry, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_WITHIN
    url = f"http://127.0.0.1:{registry.port}/v2/"
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the registry exited with {process.returncode}: "
                               f"{registry.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the registry did not answer {url} within {START_WITHIN:g}s")
        time.sleep(0.2)


def hosts_toml(upstream: str) -> str:
    """containerd's hosts file: pulls and resolves go to `upstream` over plain HTTP."""
    return (f'server = "http://{upstream}"\n\n'
            f'[host."http://{upstream}"]\n'
            '  capabilities = ["pull", "resolve"]\n')


def gateway(network: str = "kind") -> str:
    """The IPv4 gateway of the Docker network the nodes are on: this machine, as they see it."""
    out = subprocess.run(
        ["docker", "network", "inspect", network, "--format",
         "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True, text=True, check=True).stdout
    (address,) = [a for a in out.split() if "." in a]
    return address


def node_addresses(nodes: Sequence[str]) -> list[str]:
    out = []
    for node in nodes:
        out.append(subprocess.run(
            ["docker", "inspect", "-f",
             "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", node],
            capture_output=True, text=True, check=True).stdout.strip())
    return out


def mirror_on_nodes(registry: Registry, nodes: Sequence[str], upstream: str) -> None:
    directory = f"{CERTS_D}/{registry.name}"
    for node in nodes:
        subprocess.run(["docker", "exec", "-i", node, "sh", "-c",
                        f"mkdir -p '{directory}' && cat > '{directory}/hosts.toml'"],
                       input=hosts_toml(upstream), text=True, check=True)


def unmirror_on_nodes(registry: Registry, nodes: Sequence[str]) -> None:
    for node in nodes:
        subprocess.run(["docker", "exec", node, "rm", "-rf", f"{CERTS_D}/{registry.name}"],
                       check=False)
