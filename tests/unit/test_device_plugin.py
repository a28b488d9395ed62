"""The fake GPU device plugin's pure part: how many devices a node has, which to prefer,
and what a container allocated some of them gets."""

from __future__ import annotations

import pytest

from e2e.device_plugin import devices

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("labels", "count"), [
    ({"modelpool.dev/fake-gpus": "2"}, 2),
    ({"modelpool.dev/fake-gpus": "0"}, 0),
])
def test_the_nodes_label_gives_the_count(labels: dict[str, str], count: int) -> None:
    assert devices.device_count(labels) == count
    assert devices.device_ids(count) == [str(i) for i in range(count)]


@pytest.mark.parametrize(("labels", "why"), [
    ({}, "has no label modelpool.dev/fake-gpus"),
    ({"modelpool.dev/fake-gpus": "two"}, "'two' is not a whole number"),
    ({"modelpool.dev/fake-gpus": "-1"}, "out of range"),
])
def test_a_bad_label_is_an_error_that_names_it(labels: dict[str, str], why: str) -> None:
    with pytest.raises(devices.CountError, match=why):
        devices.device_count(labels)


def test_an_allocation_names_the_devices_and_mounts_the_locks() -> None:
    plan = devices.allocation(["1"], ["0", "1"])
    assert plan.envs == {"NVIDIA_VISIBLE_DEVICES": "1",
                         "MODELPOOL_GPU_LOCK_DIR": "/run/modelpool-gpu-locks"}
    assert plan.mounts == [devices.Mount("/run/modelpool-gpu-locks",
                                         "/var/lib/modelpool-fake-gpu/locks", False)]
    assert devices.allocation(["0", "1"], ["0", "1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "0,1"


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown device ids: 7"):
        devices.allocation(["7"], ["0", "1"])


def test_the_preferred_devices_are_the_required_then_the_lowest() -> None:
    assert devices.preferred(["3", "1", "10", "2"], [], 2) == ["1", "2"]
    assert devices.preferred(["0", "1", "2"], ["2"], 2) == ["2", "0"]
