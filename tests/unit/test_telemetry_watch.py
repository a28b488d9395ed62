"""The watch query every program sends."""

from __future__ import annotations

import pytest

from telemetry.watch import watch_params

pytestmark = pytest.mark.unit


def test_a_watch_resumes_from_its_version_with_bookmarks_and_a_server_timeout() -> None:
    assert watch_params("41", 290) == {
        "watch": "true",
        "resourceVersion": "41",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "290",
    }


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        ({"label_selector": "app=a"}, {"labelSelector": "app=a"}),
        ({"field_selector": "spec.nodeName=n"}, {"fieldSelector": "spec.nodeName=n"}),
        ({"label_selector": "", "field_selector": None}, {}),
    ],
)
def test_only_the_selectors_given_are_sent(
    selectors: dict[str, str | None], expected: dict[str, str]
) -> None:
    params = watch_params("1", 10, **selectors)
    assert {k: v for k, v in params.items() if k.endswith("Selector")} == expected
