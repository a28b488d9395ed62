"""Tables for the router's Event decisions (sidecar.events) and the Event body
(sidecar.kube.event_body).

The rate limiter is driven with explicit times (a fake clock): each case feeds notes and
`due` calls at given seconds and states every post that comes out, in order.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar import events
from sidecar.activator import (
    SHUTTING_DOWN,
    SWAP_ABANDONED,
    SWAP_BUDGET_EXCEEDED,
    TOO_MANY_HELD_REQUESTS,
)
from sidecar.events import (
    HELD_REQUESTS_FAILED,
    HELD_REQUESTS_REJECTED,
    NORMAL,
    SWAP_REQUESTED,
    WARNING,
    Limiter,
    Note,
    Post,
    Refusal,
)
from sidecar.kube import event_body

pytestmark = pytest.mark.unit

NS = "demo"


# --- what to say ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resident", "held", "message"),
    [
        ("coder", 3, "router chat asked for gemma (resident coder, 3 requests held)"),
        ("coder", 1, "router chat asked for gemma (resident coder, 1 request held)"),
        (None, 2, "router chat asked for gemma (resident none, 2 requests held)"),
    ],
)
def test_swap_requested_names_router_member_resident_and_held(
    resident: str | None, held: int, message: str
) -> None:
    note = events.swap_requested(NS, "chat", "heavy", "gemma", resident, held)
    assert note == Note(NS, "heavy", NORMAL, SWAP_REQUESTED, message)


def _refused(*pairs: tuple[str, str]) -> list[Refusal]:
    return [Refusal(member, code, 503) for member, code in pairs]


@pytest.mark.parametrize(
    ("refused", "expected"),
    [
        pytest.param([], [], id="nothing"),
        pytest.param(
            _refused(("gemma", SWAP_ABANDONED), ("gemma", SWAP_ABANDONED)),
            [
                (
                    WARNING,
                    HELD_REQUESTS_FAILED,
                    "router chat failed 2 requests held for gemma: "
                    "the reconciler abandoned the swap",
                    2,
                )
            ],
            id="abandoned",
        ),
        pytest.param(
            _refused(("gemma", SWAP_BUDGET_EXCEEDED)),
            [
                (
                    WARNING,
                    HELD_REQUESTS_REJECTED,
                    "router chat answered 1 request for gemma with 503: swapBudget 60s exceeded",
                    1,
                )
            ],
            id="budget",
        ),
        pytest.param(
            _refused(("phi", TOO_MANY_HELD_REQUESTS), ("gemma", SWAP_BUDGET_EXCEEDED)),
            [
                (
                    WARNING,
                    HELD_REQUESTS_REJECTED,
                    "router chat answered 1 request for phi with 503: maxHeldRequests 100 reached",
                    1,
                ),
                (
                    WARNING,
                    HELD_REQUESTS_REJECTED,
                    "router chat answered 1 request for gemma with 503: swapBudget 60s exceeded",
                    1,
                ),
            ],
            id="each cause and member apart, in order",
        ),
        pytest.param(
            _refused(
                ("gemma", SWAP_BUDGET_EXCEEDED),
                ("phi", SWAP_BUDGET_EXCEEDED),
                ("gemma", SWAP_BUDGET_EXCEEDED),
            ),
            [
                (
                    WARNING,
                    HELD_REQUESTS_REJECTED,
                    "router chat answered 2 requests for gemma with 503: swapBudget 60s exceeded",
                    2,
                ),
                (
                    WARNING,
                    HELD_REQUESTS_REJECTED,
                    "router chat answered 1 request for phi with 503: swapBudget 60s exceeded",
                    1,
                ),
            ],
            id="counted per member",
        ),
        pytest.param(_refused(("gemma", SHUTTING_DOWN)), [], id="shutdown is no news"),
    ],
)
def test_refusals_become_one_note_per_member_and_cause(
    refused: list[Refusal], expected: list[tuple[str, str, str, int]]
) -> None:
    notes = events.refusals(NS, "chat", "heavy", refused, swap_budget=60.0, max_held=100)
    assert [(n.type, n.reason, n.message, n.requests) for n in notes] == expected
    assert all((n.namespace, n.pool) == (NS, "heavy") for n in notes)


# --- how often --------------------------------------------------------------------------


def rejected(pool: str = "heavy", n: int = 1, member: str = "gemma") -> Note:
    return Note(NS, pool, WARNING, HELD_REQUESTS_REJECTED, f"{n} for {member}", n)


ASKED = Note(NS, "heavy", NORMAL, SWAP_REQUESTED, "asked")


@dataclass(frozen=True)
class Due:
    """Call `due` (the shell's timer firing)."""


Step = tuple[float, Note | Due]


def run(steps: list[Step], window: float = 30.0) -> tuple[Limiter, list[tuple[float, Post]]]:
    state = Limiter(window=window)
    out: list[tuple[float, Post]] = []
    for now, what in steps:
        if isinstance(what, Due):
            state, posts = events.due(state, now)
        else:
            state, posts = events.offer(state, what, now)
        out += [(now, p) for p in posts]
    return state, out


def alone(note: Note) -> Post:
    return Post(note.namespace, note.pool, note.type, note.reason, note.message)


def summary(note: Note, text: str, count: int, span: float) -> Post:
    return Post(note.namespace, note.pool, note.type, note.reason, text, count, span)


CASES: list[tuple[str, list[Step], list[tuple[float, Post]]]] = [
    (
        "the first note is posted at once",
        [(0.0, rejected())],
        [(0.0, alone(rejected()))],
    ),
    (
        "a flood makes one Event, then one summary when the window closes",
        [(0.0, rejected()), *[(float(t), rejected(n=2)) for t in range(1, 11)], (30.0, Due())],
        [
            (0.0, alone(rejected())),
            (
                30.0,
                summary(
                    rejected(n=2),
                    "2 for gemma (the latest of 10 in the last 29s; 20 requests in all)",
                    10,
                    29.0,
                ),
            ),
        ],
    ),
    (
        "the timer before the window closes posts nothing",
        [(0.0, rejected()), (5.0, rejected()), (29.9, Due())],
        [(0.0, alone(rejected()))],
    ),
    (
        "a summary opens a window of its own: at most one Event per window",
        [
            (0.0, rejected()),
            (5.0, rejected()),
            (30.0, Due()),
            (31.0, rejected()),
            (59.0, Due()),
            (60.0, Due()),
        ],
        [
            (0.0, alone(rejected())),
            (
                30.0,
                summary(
                    rejected(),
                    "1 for gemma (the latest of 1 in the last 25s; 1 request in all)",
                    1,
                    25.0,
                ),
            ),
            (
                60.0,
                summary(
                    rejected(),
                    "1 for gemma (the latest of 1 in the last 29s; 1 request in all)",
                    1,
                    29.0,
                ),
            ),
        ],
    ),
    (
        "a note after a quiet window is posted alone",
        [(0.0, rejected()), (30.0, Due()), (45.0, rejected(n=4))],
        [(0.0, alone(rejected())), (45.0, alone(rejected(n=4)))],
    ),
    (
        "a note after a closed window that nobody flushed joins its summary",
        [(0.0, rejected()), (10.0, rejected(n=2)), (40.0, rejected(n=3)), (75.0, Due())],
        [
            (0.0, alone(rejected())),
            (
                40.0,
                summary(
                    rejected(n=3),
                    "3 for gemma (the latest of 2 in the last 30s; 5 requests in all)",
                    2,
                    30.0,
                ),
            ),
        ],
    ),
    (
        "pools and reasons are limited apart",
        [(0.0, rejected()), (1.0, rejected(pool="light")), (2.0, ASKED), (3.0, rejected())],
        [
            (0.0, alone(rejected())),
            (1.0, alone(rejected(pool="light"))),
            (2.0, alone(ASKED)),
        ],
    ),
    (
        "a folded SwapRequested counts notes, not requests",
        [(0.0, ASKED), (3.0, ASKED), (30.0, Due())],
        [
            (0.0, alone(ASKED)),
            (30.0, summary(ASKED, "asked (the latest of 1 in the last 27s)", 1, 27.0)),
        ],
    ),
]


@pytest.mark.parametrize(("steps", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rate_limiter(steps: list[Step], expected: list[tuple[float, Post]]) -> None:
    _, posts = run(steps)
    assert posts == expected


def test_next_due_is_when_a_window_with_folded_notes_closes() -> None:
    state, _ = run([(0.0, rejected())])
    assert events.next_due(state) is None  # nothing folded: nothing to wake for
    state, _ = run([(0.0, rejected()), (4.0, ASKED), (7.0, ASKED), (9.0, rejected())])
    assert events.next_due(state) == 30.0  # the rejection's window; SwapRequested opened at 4


def test_quiet_windows_are_forgotten() -> None:
    state, _ = run([(0.0, rejected()), (1.0, rejected(pool="light"))])
    state, posts = events.due(state, 31.0)
    assert posts == [] and dict(state.windows) == {}


# --- the Event body ---------------------------------------------------------------------

NOW = datetime(2026, 11, 30, 10, 0, 5, 250000, tzinfo=UTC)


def test_event_body_is_a_core_v1_event_on_the_pool() -> None:
    post = Post(NS, "heavy", NORMAL, SWAP_REQUESTED, "router chat asked for gemma")
    body = event_body(post, "uid-1", "chat-7d9c-abcde", NOW)
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "heavy.", "namespace": NS},
        "involvedObject": {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "name": "heavy",
            "namespace": NS,
            "uid": "uid-1",
        },
        "type": "Normal",
        "reason": "SwapRequested",
        "message": "router chat asked for gemma",
        "action": "SwapRequested",
        "source": {"component": "modelpool.dev/router"},
        "reportingComponent": "modelpool.dev/router",
        "reportingInstance": "chat-7d9c-abcde",
        "firstTimestamp": "2026-11-30T10:00:05Z",
        "lastTimestamp": "2026-11-30T10:00:05Z",
        "eventTime": "2026-11-30T10:00:05.250000Z",
        "count": 1,
    }


def test_a_summary_body_spans_its_notes_and_counts_them() -> None:
    post = Post(NS, "heavy", WARNING, HELD_REQUESTS_REJECTED, "x" * 2000, count=7, span=29.0)
    body = event_body(post, None, "p" * 200, NOW)
    assert body["count"] == 7
    assert body["firstTimestamp"] == "2026-11-30T09:59:36Z"
    assert body["lastTimestamp"] == "2026-11-30T10:00:05Z"
    assert len(body["message"]) == 1024 and len(body["reportingInstance"]) == 128
    assert "uid" not in body["involvedObject"]


# --- layering ---------------------------------------------------------------------------


def test_the_decisions_import_nothing_that_waits_or_talks() -> None:
    source = Path(events.__file__).read_text()
    imported = {
        (node.module or "").split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
    } | {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    io = {"kr8s", "httpx", "aiohttp", "asyncio", "time", "socket", "os", "logging"}
    assert imported & io == set()
    assert "sidecar" in imported  # it does read the activator's error codes


def test_a_rejection_names_the_status_the_client_was_answered() -> None:
    """The text follows what was sent, not a literal: a refusal answered otherwise says so."""
    notes = events.refusals(NS, "chat", "heavy", [Refusal("gemma", SWAP_BUDGET_EXCEEDED, 504)],
                            swap_budget=60, max_held=100)
    assert [n.message for n in notes] == [
        "router chat answered 1 request for gemma with 504: swapBudget 60s exceeded"]
