"""The EndpointSlice index (sidecar.endpoints): ready and not-yet-ready addresses per
Service, and the short-lived bad marks after a connection failure."""

from __future__ import annotations

import pytest

from sidecar.endpoints import Endpoint, EndpointIndex, EndpointSlice

pytestmark = pytest.mark.unit


def _slice(
    name: str, service: str, *endpoints: tuple[str, bool], port: int | None = 8080
) -> EndpointSlice:
    return EndpointSlice(name, service, port, tuple(Endpoint(a, r) for a, r in endpoints))


def test_ready_and_not_ready_addresses_are_kept_apart() -> None:
    index = EndpointIndex()
    index.replace_all(
        [
            _slice("gemma-a", "gemma", ("127.0.1.2", True), ("127.0.1.3", False)),
            _slice("coder-a", "coder", ("127.0.1.4", False)),
        ]
    )
    assert index.ready_addresses("gemma", 0) == ["127.0.1.2:8080"]
    assert index.not_ready_addresses("gemma", 0) == ["127.0.1.3:8080"]
    assert index.ready_addresses("coder", 0) == []
    assert index.not_ready_addresses("coder", 0) == ["127.0.1.4:8080"]
    assert index.not_ready_addresses("phi", 0) == []


def test_an_address_turning_ready_leaves_the_not_ready_list() -> None:
    index = EndpointIndex()
    index.upsert(_slice("gemma-a", "gemma", ("127.0.1.3", False)))
    index.upsert(_slice("gemma-a", "gemma", ("127.0.1.3", True)))
    assert index.not_ready_addresses("gemma", 0) == []
    assert index.pick("gemma", 0) == "127.0.1.3:8080"
    # Listed ready by one slice and not ready by another (a slice being replaced): ready.
    index.upsert(_slice("gemma-b", "gemma", ("127.0.1.3", False)))
    assert index.not_ready_addresses("gemma", 0) == []


def test_a_bad_mark_hides_a_not_ready_address_until_it_expires() -> None:
    index = EndpointIndex(bad_ttl=5.0)
    index.upsert(_slice("gemma-a", "gemma", ("127.0.1.3", False), port=None))
    assert index.not_ready_addresses("gemma", 0) == []  # no port, no default
    assert index.not_ready_addresses("gemma", 0, 9000) == ["127.0.1.3:9000"]
    index.mark_bad("gemma", "127.0.1.3:9000", 10.0)
    assert index.not_ready_addresses("gemma", 11.0, 9000) == []
    assert index.not_ready_addresses("gemma", 15.0, 9000) == ["127.0.1.3:9000"]
    index.delete("gemma-a")
    assert index.not_ready_addresses("gemma", 15.0, 9000) == []
