"""Pure helpers of the reconciler's shell: drift detection and the request CAS."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.controller import covers
from reconciler.kube import clear_request_ops, request_cas_ops

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
