"""Pure helpers of the reconciler's shell: drift detection and the request CAS."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kubecore.pool_request import clear_request_ops
from kubecore.pool_request import next_request_ops as request_cas_ops
from reconciler.kube import KubeError, NamespaceTerminating
from reconciler.logs import ObjectLogger
from reconciler.objects import covers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("desired", "live", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),  # the server's defaults are extra fields
        ({"a": 1}, {"a": "1"}, True),  # quantities come back as text
        ({"a": {"b": [1, {"c": "x"}]}}, {"a": {"b": [1, {"c": "x", "d": 0}]}}, True),
        ({"spec": {"replicas": 0}}, {"spec": {"replicas": 1}}, False),  # a hand edit
        ({"a": [1, 2]}, {"a": [1]}, False),
        ({"a": True}, {"a": "True"}, False),
        ({"a": None}, {}, True),
        ({"a": 1}, {}, False),
    ],
)
def test_covers(desired: Any, live: Any, expected: bool) -> None:
    assert covers(desired, live) is expected


def test_request_cas_ops_follow_the_contract() -> None:
    new = {"member": "b", "requestedBy": "x"}
    assert request_cas_ops({"request": {"member": "a", "generation": 4}}, "9", new) == [
        {"op": "test", "path": "/status/request/generation", "value": 4},
        {"op": "replace", "path": "/status/request", "value": {**new, "generation": 5}},
    ]
    assert request_cas_ops({"phase": "Ready"}, "9", new) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
        {"op": "add", "path": "/status/request", "value": {**new, "generation": 1}},
    ]
    assert request_cas_ops(None, "9", new)[1] == {
        "op": "add", "path": "/status", "value": {"request": {**new, "generation": 1}}
    }
    assert clear_request_ops(7, {"member": None}) == [
        {"op": "test", "path": "/status/request/generation", "value": 7},
        {"op": "replace", "path": "/status/request", "value": {"member": None, "generation": 8}},
    ]


def test_the_entry_point_dispatches_render(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    import yaml

    from reconciler.__main__ import main

    examples = Path(__file__).resolve().parents[2] / "examples"
    assert main(["render", str(examples / "model-servers.yaml"), str(examples / "pool.yaml")]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert "Deployment" in kinds and "Service" in kinds


def test_settings_come_from_flags_and_environment() -> None:
    from reconciler.settings import parse

    settings = parse(
        ["--namespace", "demo", "--leader-elect", "--metrics-port", "9100",
         "--lease-duration", "9"],
        {"MODELPOOL_BIND_HOST": "127.0.0.5", "POD_NAME": "r-1", "POD_NAMESPACE": "ops"},
    )
    assert (settings.namespace, settings.bind_host, settings.metrics_port) == (
        "demo", "127.0.0.5", 9100)
    assert settings.leader.enabled and settings.leader.identity == "r-1"
    assert settings.leader.namespace == "ops"
    assert (settings.leader.lease_seconds, settings.leader.renew_seconds) == (9.0, 3.0)
    assert parse([], {}).bind_host == "0.0.0.0"


async def test_an_event_refused_for_good_ends_the_reconcile_and_others_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Warning posted before a stall is written: in a namespace being deleted its refusal
    must reach the worker (which stops there), not be logged and let the stall be written."""
    refusal: list[Exception] = [NamespaceTerminating("events is forbidden", 403, "Forbidden")]

    async def poster(body: Any, type_: str, reason: str, message: str) -> None:
        raise refusal[0]

    body = {"kind": "ModelRouter", "metadata": {"namespace": "n", "name": "chat"}}
    logger = ObjectLogger(logging.getLogger("t"), body, poster, final=(NamespaceTerminating,))
    with pytest.raises(NamespaceTerminating):
        await logger.event("Warning", "CannotRender", "server a is missing")
    refusal[0] = KubeError("etcd is slow", 500, "InternalError")
    await logger.event("Warning", "CannotRender", "server a is missing")
    assert "could not post Event CannotRender: etcd is slow" in caplog.text
