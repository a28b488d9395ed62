"""Integration tests run against the real API server of the local cluster (see
e2e/local/fixtures.py for the fixtures, tests/conftest.py for how they are marked).

Every test ends with a garbage collection, so a socket or transport a test leaves open is
reported (as the ResourceWarning that filterwarnings turns into an error) on that test,
not on whichever later test the collector happens to run in."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def collect_garbage_after_each_test() -> Iterator[None]:
    yield
    gc.collect()
