"""Probe specs (defaults, named ports) and the probe state machine."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.local.node_agent.probes import ProbeState, probe_spec, resolve_port, step

pytestmark = pytest.mark.unit

CONTAINER: dict[str, Any] = {
    "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9090}]
}


def test_defaults_and_named_port() -> None:
    spec = probe_spec({"httpGet": {"path": "/health", "port": "http"}}, CONTAINER, "127.0.1.4")
    assert (spec.kind, spec.host, spec.port, spec.path) == ("httpGet", "127.0.1.4", 8080, "/health")
    assert (spec.initial_delay, spec.period, spec.timeout) == (0, 10, 1)
    assert (spec.success_threshold, spec.failure_threshold) == (1, 3)


def test_explicit_settings() -> None:
    probe = {"httpGet": {"port": 9090, "httpHeaders": [{"name": "X", "value": "1"}]},
             "initialDelaySeconds": 2, "periodSeconds": 1, "timeoutSeconds": 3,
             "successThreshold": 2, "failureThreshold": 5}
    spec = probe_spec(probe, CONTAINER, "127.0.1.4")
    assert (spec.port, spec.path, spec.headers) == (9090, "/", (("X", "1"),))
    assert (spec.initial_delay, spec.period, spec.timeout) == (2, 1, 3)
    assert (spec.success_threshold, spec.failure_threshold) == (2, 5)


def test_tcp_and_unsupported_kinds() -> None:
    assert probe_spec({"tcpSocket": {"port": "http"}}, CONTAINER, "h").kind == "tcpSocket"
    assert probe_spec({"exec": {"command": ["true"]}}, CONTAINER, "h").kind == "exec"


def test_unknown_port_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="metrics"):
        resolve_port("metrics", CONTAINER["ports"])


def run(outcomes: list[bool], success: int = 1, failure: int = 3) -> list[bool | None]:
    spec = probe_spec({"httpGet": {"port": 1}, "successThreshold": success,
                       "failureThreshold": failure}, {}, "h")
    state = ProbeState()
    out = []
    for ok in outcomes:
        state = step(spec, state, ok)
        out.append(state.result)
    return out


def test_success_after_threshold() -> None:
    assert run([False, True, True], success=2) == [None, None, True]


def test_failure_needs_consecutive_failures() -> None:
    assert run([True, False, False, True, False, False, False]) == [
        True, True, True, True, True, True, False,
    ]


def test_recovery_after_failure() -> None:
    assert run([False, False, False, True], failure=3) == [None, None, False, True]
