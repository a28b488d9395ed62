"""Which Kubernetes Events a router posts about its ModelPools, and how often.

A person running `kubectl describe modelpool` should see a router ask for a swap, and see
held requests turned away; a flood of rejections must not become a flood of Events. This
module decides both without I/O: it turns what the activator did into notes, and a rate
limiter lets at most one Event per pool and reason through per window. Notes that arrive
inside a window are folded into one summary Event, posted when the window closes (or with
the next note after it): its message counts them, and its core/v1 `count` says how many
notes it stands for. The shell (`sidecar.activation`) feeds the time and hands the posts
to `sidecar.kube`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from sidecar.activator import SWAP_ABANDONED, SWAP_BUDGET_EXCEEDED, TOO_MANY_HELD_REQUESTS

NORMAL = "Normal"
WARNING = "Warning"

SWAP_REQUESTED = "SwapRequested"
HELD_REQUESTS_FAILED = "HeldRequestsFailed"
HELD_REQUESTS_REJECTED = "HeldRequestsRejected"

WINDOW_SECONDS = 30.0

# The activator's error codes that are news to a person watching the pool.
REPORTED_CODES = frozenset({SWAP_ABANDONED, SWAP_BUDGET_EXCEEDED, TOO_MANY_HELD_REQUESTS})


@dataclass(frozen=True)
class Note:
    """Something a person watching the pool should see: one Event, unless rate-limited."""

    namespace: str
    pool: str
    type: str  # NORMAL or WARNING
    reason: str
    message: str
    requests: int = 0  # requests turned away that the note speaks of (0: not that kind)


@dataclass(frozen=True)
class Post:
    """One Event to create on the ModelPool `namespace/pool`."""

    namespace: str
    pool: str
    type: str
    reason: str
    message: str
    count: int = 1  # how many notes it stands for (core/v1 Event `count`)
    span: float = 0.0  # seconds from the first of them to this post


@dataclass(frozen=True)
class Refusal:
    """A request the activator answered with an error (its `Fail` action)."""

    member: str
    code: str
    status: int  # what the client was answered


# --- notes --------------------------------------------------------------------------------


def swap_requested(
    namespace: str, router: str, pool: str, member: str, resident: str | None, held: int
) -> Note:
    """A router wrote a request for `member` into the pool's status.request."""
    return Note(
        namespace,
        pool,
        NORMAL,
        SWAP_REQUESTED,
        f"router {router} asked for {member} "
        f"(resident {resident or 'none'}, {_requests(held)} held)",
    )


def refusals(
    namespace: str,
    router: str,
    pool: str,
    refused: Iterable[Refusal],
    *,
    swap_budget: float,
    max_held: int,
) -> list[Note]:
    """One note per member and cause for the requests one step of the activator turned
    away, in the order they were first refused. Shutting down is no news: no note."""
    counts: dict[tuple[str, str, int], int] = {}
    for r in refused:
        if r.code in REPORTED_CODES:
            key = (r.code, r.member, r.status)
            counts[key] = counts.get(key, 0) + 1
    notes: list[Note] = []
    for (code, member, status), n in counts.items():
        if code == SWAP_ABANDONED:
            notes.append(
                Note(
                    namespace,
                    pool,
                    WARNING,
                    HELD_REQUESTS_FAILED,
                    f"router {router} failed {_requests(n)} held for {member}: "
                    "the reconciler abandoned the swap",
                    n,
                )
            )
            continue
        why = (
            f"swapBudget {swap_budget:g}s exceeded"
            if code == SWAP_BUDGET_EXCEEDED
            else f"maxHeldRequests {max_held} reached"
        )
        notes.append(
            Note(
                namespace,
                pool,
                WARNING,
                HELD_REQUESTS_REJECTED,
                f"router {router} answered {_requests(n)} for {member} with {status}: {why}",
                n,
            )
        )
    return notes


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


# --- the rate limiter ---------------------------------------------------------------------

Key = tuple[str, str, str]  # namespace, pool, reason


@dataclass(frozen=True)
class Window:
    """One pool and reason: an Event went out at `opened`; `folded` notes came since."""

    opened: float
    folded: int = 0
    requests: int = 0
    first: float | None = None  # when the first folded note came
    last: Note | None = None  # the newest folded note


@dataclass(frozen=True)
class Limiter:
    window: float = WINDOW_SECONDS
    windows: Mapping[Key, Window] = field(default_factory=dict)


def offer(state: Limiter, note: Note, now: float) -> tuple[Limiter, list[Post]]:
    """A note arrives: post it when its pool and reason have had no Event for a window;
    else fold it into the window, to be counted in the next Event."""
    key = (note.namespace, note.pool, note.reason)
    current = state.windows.get(key)
    if current is not None and now < current.opened + state.window:
        folded = Window(
            current.opened,
            current.folded + 1,
            current.requests + note.requests,
            current.first if current.first is not None else now,
            note,
        )
        return _with(state, key, folded), []
    if current is not None and current.last is not None:
        # The window closed with notes in it and nobody flushed them yet: this note joins
        # their summary, which is the one Event of the new window.
        joined = Window(
            current.opened,
            current.folded + 1,
            current.requests + note.requests,
            current.first,
            note,
        )
        return _with(state, key, Window(now)), [_summary(joined, now)]
    post = Post(note.namespace, note.pool, note.type, note.reason, note.message)
    return _with(state, key, Window(now)), [post]


def due(state: Limiter, now: float) -> tuple[Limiter, list[Post]]:
    """Windows that have closed: post the summary of each that folded notes (it opens a
    new window), and forget the quiet ones."""
    posts: list[Post] = []
    windows: dict[Key, Window] = {}
    for key, w in state.windows.items():
        if now < w.opened + state.window:
            windows[key] = w
        elif w.last is not None:
            posts.append(_summary(w, now))
            windows[key] = Window(now)
    if not posts and len(windows) == len(state.windows):
        return state, []
    return replace(state, windows=windows), posts


def next_due(state: Limiter) -> float | None:
    """When a window with folded notes closes, or None."""
    return min(
        (w.opened + state.window for w in state.windows.values() if w.last is not None),
        default=None,
    )


def _summary(w: Window, now: float) -> Post:
    assert w.last is not None and w.first is not None
    note = w.last
    span = now - w.first
    tail = f"the latest of {w.folded} in the last {span:.0f}s"
    if w.requests:
        tail += f"; {_requests(w.requests)} in all"
    return Post(
        note.namespace,
        note.pool,
        note.type,
        note.reason,
        f"{note.message} ({tail})",
        count=w.folded,
        span=span,
    )


def _with(state: Limiter, key: Key, window: Window) -> Limiter:
    return replace(state, windows={**state.windows, key: window})
