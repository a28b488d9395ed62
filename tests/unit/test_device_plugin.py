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


def test_shared_mode_advertises_each_device_shares_times_and_gives_its_memory() -> None:
    labels = {"modelpool.dev/fake-gpus": "2", "modelpool.dev/fake-gpu-shares": "3",
              "modelpool.dev/fake-gpu-memory-mib": "8192"}
    how = devices.sharing(labels)
    assert how == devices.Sharing(3, 8 << 30)
    ids = devices.advertised_ids(devices.device_count(labels), how)
    assert ids == ["0::0", "0::1", "0::2", "1::0", "1::1", "1::2"]
    plan = devices.allocation(["1::2"], ids, how)
    assert plan.envs == {"NVIDIA_VISIBLE_DEVICES": "1",
                         "MODELPOOL_GPU_LOCK_DIR": "/run/modelpool-gpu-locks",
                         "MODELPOOL_GPU_MEMORY": str(8 << 30)}
    # Two shares of one device name it once.
    assert devices.allocation(["0::0", "0::1"], ids, how).envs["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert devices.preferred(["1::0", "0::2", "0::1"], [], 2) == ["0::1", "0::2"]


def test_without_shares_labels_the_devices_are_exclusive_and_have_no_memory() -> None:
    how = devices.sharing({"modelpool.dev/fake-gpus": "2"})
    assert how == devices.Sharing(1, None)
    assert devices.advertised_ids(2, how) == ["0", "1"]
    assert "MODELPOOL_GPU_MEMORY" not in devices.allocation(["0"], ["0", "1"], how).envs


@pytest.mark.parametrize(("labels", "why"), [
    ({"modelpool.dev/fake-gpu-shares": "2"}, "needs modelpool.dev/fake-gpu-memory-mib"),
    ({"modelpool.dev/fake-gpu-shares": "0", "modelpool.dev/fake-gpu-memory-mib": "8"},
     "out of range"),
    ({"modelpool.dev/fake-gpu-memory-mib": "8G"}, "'8G' is not a whole number"),
])
def test_a_bad_sharing_label_is_an_error_that_names_it(labels: dict[str, str], why: str) -> None:
    with pytest.raises(devices.CountError, match=why):
        devices.sharing(labels)
