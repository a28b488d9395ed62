"""The tier rules of the suite itself: a test's marker matches its directory, so the fast
runs the README offers (`pytest -m unit`, `pytest tests/functional`) miss nothing, and no
test reaches the cluster without a cluster tier."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.local import fixtures
from e2e.local.paths import REPO_ROOT

pytestmark = pytest.mark.unit


@dataclass
class FakeItem:
    """What the rules read of a collected test."""

    path: Path
    marks: set[str]
    fixturenames: tuple[str, ...] = ()
    nodeid: str = field(default="")

    def __post_init__(self) -> None:
        self.nodeid = f"{self.path.relative_to(REPO_ROOT)}::test_x"

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def item(directory: str, *marks: str, fixtures_: tuple[str, ...] = ()) -> FakeItem:
    return FakeItem(REPO_ROOT / directory / "test_x.py", set(marks), fixtures_)


@pytest.mark.parametrize(("where", "mark"), [
    ("tests/unit", "functional"),
    ("tests/functional", "unit"),
    ("tests/unit", "integration"),
])
def test_a_tier_other_than_the_directorys_is_refused(where: str, mark: str) -> None:
    with pytest.raises(pytest.UsageError, match=r"other than their directory's.*test_x"):
        fixtures.check_tiers([item(where, mark)])  # type: ignore[list-item]


@pytest.mark.parametrize(("where", "mark"), [
    ("tests/unit", "unit"),
    ("tests/functional", "functional"),
    ("e2e/tests", "unit"),  # a pure check of an e2e helper, beside it
    ("e2e/tests", "e2e"),
])
def test_the_directorys_own_tier_is_accepted(where: str, mark: str) -> None:
    fixtures.check_tiers([item(where, mark)])  # type: ignore[list-item]


def test_a_test_using_the_cluster_needs_a_cluster_tier() -> None:
    with pytest.raises(pytest.UsageError, match="use the cluster"):
        fixtures.check_tiers([item("e2e/tests", "unit", fixtures_=("cluster",))])  # type: ignore[list-item]
