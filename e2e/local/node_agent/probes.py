"""Readiness, liveness and startup probes as a pure state machine.

The shell runs one probe loop per probe: it waits `initial_delay`, then every `period`
asks `probe_http` (in `http.py`) for an outcome and feeds it to `step`. What a probe
result means for the container (ready or not, restart) is decided by the shell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from e2e.local.node_agent.podspec import Json


@dataclass(frozen=True)
class ProbeSpec:
    kind: str  # httpGet, tcpSocket, or an unsupported kind (exec, grpc)
    host: str
    port: int
    path: str
    scheme: str
    headers: tuple[tuple[str, str], ...]
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int


def resolve_port(port: int | str, container_ports: Sequence[Json]) -> int:
    """A probe port given by number or by the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for candidate in container_ports:
        if candidate.get("name") == port:
            return int(candidate["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def probe_spec(probe: Json, container: Json, pod_ip: str) -> ProbeSpec:
    """A probe of the container spec with the Kubernetes defaults filled in."""
    ports = container.get("ports") or []
    kind, host, port, path, scheme = "unsupported", pod_ip, 0, "/", "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    if "httpGet" in probe:
        action: Mapping[str, object] = probe["httpGet"]
        kind = "httpGet"
        host = str(action.get("host") or pod_ip)
        port = resolve_port(action["port"], ports)  # type: ignore[arg-type]
        path = str(action.get("path") or "/")
        scheme = str(action.get("scheme") or "HTTP")
        headers = tuple(
            (str(h["name"]), str(h["value"]))
            for h in probe["httpGet"].get("httpHeaders") or []
        )
    elif "tcpSocket" in probe:
        kind = "tcpSocket"
        host = str(probe["tcpSocket"].get("host") or pod_ip)
        port = resolve_port(probe["tcpSocket"]["port"], ports)
    elif "exec" in probe:
        kind = "exec"
    elif "grpc" in probe:
        kind = "grpc"
    return ProbeSpec(
        kind=kind,
        host=host,
        port=port,
        path=path,
        scheme=scheme,
        headers=headers,
        initial_delay=float(probe.get("initialDelaySeconds", 0)),
        period=float(probe.get("periodSeconds", 10)),
        timeout=float(probe.get("timeoutSeconds", 1)),
        success_threshold=int(probe.get("successThreshold", 1)),
        failure_threshold=int(probe.get("failureThreshold", 3)),
    )


@dataclass(frozen=True)
class ProbeState:
    """`result` is the probe's current verdict; None before it has one."""

    result: bool | None = None
    successes: int = 0
    failures: int = 0


def step(spec: ProbeSpec, state: ProbeState, ok: bool) -> ProbeState:
    """Feed one outcome: the verdict flips to success after `success_threshold`
    consecutive successes and to failure after `failure_threshold` consecutive failures."""
    if ok:
        state = replace(state, successes=state.successes + 1, failures=0)
        if state.successes >= spec.success_threshold:
            state = replace(state, result=True)
    else:
        state = replace(state, failures=state.failures + 1, successes=0)
        if state.failures >= spec.failure_threshold:
            state = replace(state, result=False)
    return state
