"""The bodies the activator's Kubernetes adapter sends and reads (sidecar.kube), pinned to
docs/contracts.md section 2 without a cluster."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from kubecore.refusal import read_refusal
from kubecore.watch import Gone as _Gone
from sidecar.activator import LastSwap, PoolRequest, PoolStatus, SwapProgress, WriteRequest
from sidecar.endpoints import Endpoint
from sidecar.kube import (
    _NotFound,
    _refused,
    _translate,
    parse_pool,
    parse_slice,
    request_patch,
)
from sidecar.kube_port import Conflict, KubeError

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 30, 10, 0, 5, tzinfo=UTC)
VALUE = {
    "member": "gemma",
    "generation": 8,
    "requestedAt": "2026-11-30T10:00:05Z",
    "requestedBy": "demo/chat/chat-a",
}


@pytest.mark.parametrize(
    ("write", "patch"),
    [
        (
            WriteRequest(
                PoolRequest("gemma", 8, "demo/chat/chat-a"), PoolRequest("coder", 7), "42", True
            ),
            [
                {"op": "test", "path": "/status/request/generation", "value": 7},
                {"op": "replace", "path": "/status/request", "value": VALUE},
            ],
        ),
        (
            WriteRequest(PoolRequest("gemma", 8, "demo/chat/chat-a"), None, "42", True),
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status/request", "value": VALUE},
            ],
        ),
        (
            WriteRequest(PoolRequest("gemma", 8, "demo/chat/chat-a"), None, "42", False),
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status", "value": {"request": VALUE}},
            ],
        ),
        (
            WriteRequest(
                PoolRequest(None, 8, "demo/chat/chat-a"), PoolRequest("gemma", 7), "42", True
            ),
            [
                {"op": "test", "path": "/status/request/generation", "value": 7},
                {"op": "replace", "path": "/status/request", "value": {**VALUE, "member": None}},
            ],
        ),
    ],
    ids=["replace", "add-request", "add-status", "withdraw"],
)
def test_request_patch(write: WriteRequest, patch: list[dict[str, Any]]) -> None:
    assert request_patch(write, NOW) == patch


def test_parse_pool_reads_every_field_the_router_uses() -> None:
    obj = {
        "metadata": {"name": "heavy", "resourceVersion": "42"},
        "status": {
            "phase": "Swapping",
            "residentMember": "coder",
            "request": {"member": "gemma", "generation": 7, "requestedBy": "demo/chat/a"},
            "swap": {"from": "coder", "to": "gemma", "generation": 7, "phase": "Draining"},
            "lastSwap": {
                "from": "gemma",
                "to": "coder",
                "generation": 6,
                "durationSeconds": 4.2,
                "outcome": "Succeeded",
            },
        },
    }
    assert parse_pool(obj) == PoolStatus(
        "heavy",
        "42",
        True,
        "coder",
        PoolRequest("gemma", 7, "demo/chat/a"),
        SwapProgress("coder", "gemma", 7, "Draining"),
        LastSwap("gemma", "coder", 6, "Succeeded", 4.2),
    )


@pytest.mark.parametrize(("reason", "stuck_on"), [
    ("Swapping", None),
    ("Unschedulable", "gemma cannot be scheduled: 0/1 nodes are available"),
    ("CrashLoopBackOff", "gemma cannot be scheduled: 0/1 nodes are available"),
])
def test_parse_pool_reads_what_a_swap_is_stuck_on(reason: str, stuck_on: str | None) -> None:
    obj = {"metadata": {"name": "heavy", "resourceVersion": "1"}, "status": {
        "swap": {"from": "coder", "to": "gemma", "phase": "Loading"},
        "conditions": [
            {"type": "Reconciling", "status": "True", "reason": reason, "message": "x"},
            {"type": "Ready", "status": "False", "reason": reason,
             "message": "gemma cannot be scheduled: 0/1 nodes are available"}]}}
    swap = parse_pool(obj).swap
    assert swap is not None and swap.stuck_on == stuck_on


@pytest.mark.parametrize(
    ("status", "present", "expected"),
    [
        (None, False, None),
        ({}, True, None),
        ({"request": None}, True, None),
        ({"request": {"member": None, "generation": 3}}, True, PoolRequest(None, 3)),
    ],
)
def test_parse_pool_without_a_request(
    status: dict[str, Any] | None, present: bool, expected: PoolRequest | None
) -> None:
    obj: dict[str, Any] = {"metadata": {"name": "heavy", "resourceVersion": "1"}}
    if status is not None:
        obj["status"] = status
    parsed = parse_pool(obj)
    assert (parsed.status_present, parsed.request, parsed.swap) == (present, expected, None)


def test_parse_pool_reads_a_budgeted_pools_residents_and_loads() -> None:
    obj = {
        "metadata": {"name": "heavy", "resourceVersion": "43"},
        "status": {
            "residentMember": "gemma",
            "residents": [
                {"name": "coder", "since": "2026-11-30T09:00:00Z", "gpuMemory": 8589934592},
                {"name": "gemma", "since": "2026-11-30T09:30:00Z", "gpuMemory": 4294967296},
                {"since": "2026-11-30T09:31:00Z"},  # no name: not a resident
            ],
            "roomLeft": 4294967296,
            "members": [
                {"name": "coder", "phase": "Ready", "gpuMemory": 8589934592},
                {"name": "phi", "phase": "Stopped", "gpuMemory": 6442450944},
                {"name": "qwen", "phase": "Stopped", "gpuMemory": "6Gi"},  # not bytes: unknown
            ],
            "loads": [
                {"to": "phi", "generation": 7, "phase": "Draining", "victims": ["coder"]},
                {"to": "qwen", "generation": None, "phase": "Loading", "victims": [],
                 "restores": True},
                {"phase": "Loading"},  # no target: not a load
            ],
            "swap": {"from": "coder", "to": "phi", "generation": 7, "phase": "Saving",
                     "restores": True},
        },
    }
    parsed = parse_pool(obj)
    assert parsed.residents == frozenset({"coder", "gemma"})
    assert parsed.loads == (
        SwapProgress("coder", "phi", 7, "Draining", None, ("coder",)),
        SwapProgress(None, "qwen", None, "Loading", restores=True),
    )
    assert parsed.swap == SwapProgress("coder", "phi", 7, "Saving", restores=True)
    assert parsed.resident_member == "gemma"
    assert parsed.room_left == 4294967296
    assert parsed.footprints == {"coder": 8589934592, "gemma": 4294967296, "phi": 6442450944}


@pytest.mark.parametrize(
    ("status", "residents", "loads"),
    [
        ({"residentMember": "coder"}, None, ()),
        ({"residents": None, "loads": None}, None, ()),
        ({"residents": [], "loads": []}, frozenset[str](), ()),
        ({"residents": "coder", "loads": {"to": "phi"}}, None, ()),
    ],
    ids=["exclusive", "null", "empty-set", "malformed"],
)
def test_parse_pool_tells_an_exclusive_pool_from_an_empty_set(
    status: dict[str, Any], residents: frozenset[str] | None, loads: tuple[SwapProgress, ...]
) -> None:
    parsed = parse_pool({"metadata": {"name": "heavy", "resourceVersion": "1"}, "status": status})
    assert (parsed.residents, parsed.loads) == (residents, loads)
    assert (parsed.room_left, parsed.footprints) == (None, {})


def test_parse_slice_takes_the_http_port_and_readiness() -> None:
    obj = {
        "metadata": {"name": "gemma-x", "labels": {"kubernetes.io/service-name": "gemma"}},
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8080}],
        "endpoints": [
            {"addresses": ["127.0.1.4"], "conditions": {"ready": True}},
            {"addresses": ["127.0.1.5"], "conditions": {"ready": False, "terminating": True}},
            {"addresses": ["127.0.1.6"]},  # readiness unknown: treated as ready
        ],
    }
    s = parse_slice(obj)
    assert (s.name, s.service, s.port) == ("gemma-x", "gemma", 8080)
    assert s.endpoints == (
        Endpoint("127.0.1.4", True),
        Endpoint("127.0.1.5", False),
        Endpoint("127.0.1.6", True),
    )
    unnamed = parse_slice({**obj, "ports": [{"port": 8000}]})
    assert unnamed.port == 8000


@pytest.mark.parametrize(
    ("code", "kind"),
    [(422, Conflict), (409, Conflict), (410, _Gone), (404, _NotFound), (403, KubeError),
     (500, KubeError)],
)
def test_refusals_are_read_once(code: int, kind: type[Exception]) -> None:
    refused = _refused(read_refusal(code, b'{"kind": "Status", "message": "no"}'), "PATCH x")
    assert type(refused) is kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (httpx.ConnectError("refused"), KubeError),
        (ConnectionResetError(), KubeError),
    ],
)
def test_errors_are_translated_once(error: Exception, kind: type[Exception]) -> None:
    translated = _translate(error, "PATCH x")
    assert type(translated) is kind
