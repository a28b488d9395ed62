"""e2e/harness.py `eventually`: how often it checks while it waits."""

from __future__ import annotations

import pytest

from e2e import harness

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(round(seconds, 3))
        self.now += seconds


def test_the_pauses_grow_by_half_up_to_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("e2e.harness.time.monotonic", clock.monotonic)
    monkeypatch.setattr("e2e.harness.time.sleep", clock.sleep)
    checks: list[float] = []

    def check() -> bool | None:
        checks.append(clock.now)
        return True if clock.now >= 10 else None

    assert harness.eventually(check, "ten seconds", within=60) is True
    assert clock.pauses[:5] == [0.2, 0.3, 0.45, 0.675, 1.0]
    assert set(clock.pauses[5:]) == {1.0}
    assert len(checks) < 16, "a ten-second wait checked more than fifteen times"


def test_a_wait_checks_once_more_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("e2e.harness.time.monotonic", clock.monotonic)
    monkeypatch.setattr("e2e.harness.time.sleep", clock.sleep)
    checks: list[float] = []
    with pytest.raises(AssertionError, match="timed out after 3s waiting for never"):
        harness.eventually(lambda: checks.append(clock.now), "never", within=3)
    assert checks[-1] >= 3
    assert checks[-2] < 3
