"""GPU device ids and pod addresses."""

from __future__ import annotations

import pytest

from e2e.local.node_agent.allocation import Addresses, Devices

pytestmark = pytest.mark.unit


def test_devices_are_exclusive_until_released() -> None:
    devices = Devices(count=2)
    devices, first = devices.allocate("a", 1)
    devices, second = devices.allocate("b", 1)
    devices, third = devices.allocate("c", 1)
    assert (first, second, third) == ((0,), (1,), None)
    devices = devices.release("a")
    devices, third = devices.allocate("c", 1)
    assert third == (0,)


def test_allocation_is_idempotent_per_holder() -> None:
    devices, ids = Devices(count=2).allocate("a", 2)
    again, same = devices.allocate("a", 2)
    assert ids == same == (0, 1)
    assert again.free() == []


def test_asking_for_more_than_free_changes_nothing() -> None:
    devices, _ = Devices(count=2).allocate("a", 1)
    after, ids = devices.allocate("b", 2)
    assert ids is None
    assert after == devices


def test_zero_gpus_node() -> None:
    assert Devices(count=0).allocate("a", 1)[1] is None


def test_release_of_unknown_holder_is_harmless() -> None:
    devices = Devices(count=1)
    assert devices.release("nobody") == devices


def test_addresses_are_unique_loopback_and_never_the_host() -> None:
    addresses = Addresses()
    seen = []
    for i in range(600):
        addresses, ip = addresses.allocate(f"pod-{i}")
        seen.append(ip)
    assert len(set(seen)) == 600
    assert "127.0.0.1" not in seen
    assert all(ip.startswith("127.0.") for ip in seen)
    assert not any(ip.endswith((".0", ".255")) for ip in seen)
    assert seen[0] == "127.0.1.1"


def test_freed_address_is_not_reused_at_once() -> None:
    addresses, first = Addresses().allocate("a")
    addresses = addresses.release("a")
    addresses, second = addresses.allocate("b")
    assert second != first


def test_preferred_address_is_kept_when_free() -> None:
    addresses, ip = Addresses().allocate("a", preferred="127.0.3.9")
    assert ip == "127.0.3.9"
    addresses, other = addresses.allocate("b", preferred="127.0.3.9")
    assert other != "127.0.3.9"
    _, host = addresses.allocate("c", preferred="127.0.0.1")
    assert host != "127.0.0.1"
