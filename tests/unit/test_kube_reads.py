"""The pure parts of the harness's in-process reads: which kubectl arguments they take, and
how names resolve to resources from aggregated discovery."""

from __future__ import annotations

from typing import Any

import pytest

from e2e import kube_reads
from e2e.kube_reads import Query, Resource, Unsupported, parse, resources_of


def test_a_get_is_parsed_in_any_order_of_its_options() -> None:
    assert parse(("get", "pods", "-n", "ns", "-l", "a=b")) == Query(
        "pods", (), namespace="ns", selector="a=b")
    assert parse(("get", "-n", "ns", "Pod", "x", "--show-managed-fields")) == Query(
        "pod", ("x",), namespace="ns", managed=True)
    assert parse(("get", "events", "--namespace=ns", "--field-selector", "type=Warning")) == \
        Query("events", (), namespace="ns", fields="type=Warning")
    assert parse(("get", "crd", "a", "b")) == Query("crd", ("a", "b"))


@pytest.mark.parametrize("args", [
    (), ("apply", "-f", "x"), ("get",), ("get", "pods", "-A"), ("get", "pods", "-o", "yaml"),
    ("get", "pods,services"), ("get", "pod/x"), ("get", "pods", "-n"),
    ("get", "pods", "x", "-l", "a=b"),
])
def test_other_shapes_are_unsupported(args: tuple[str, ...]) -> None:
    with pytest.raises(Unsupported):
        parse(args)


def discovery(group: str, version: str, *resources: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "APIGroupDiscoveryList", "items": [
        {"metadata": {"name": group}, "versions": [
            {"version": version, "resources": list(resources)},
            {"version": "v0", "resources": [{"resource": "olds", "scope": "Cluster",
                                              "responseKind": {"kind": "Old"}}]}]}]}


def entry(plural: str, kind: str, scope: str = "Namespaced", singular: str = "",
          short: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"resource": plural, "responseKind": {"kind": kind}, "scope": scope,
            "singularResource": singular, "shortNames": list(short)}


def test_names_resolve_the_core_group_first_and_the_preferred_version() -> None:
    core = discovery("", "v1", entry("events", "Event", short=("ev",)),
                     entry("nodes", "Node", "Cluster", "node", ("no",)))
    groups = discovery("events.k8s.io", "v1", entry("events", "Event", singular="event"))
    names = resources_of([core, groups])
    assert names["events"] == Resource("", "v1", "events", "Event", True)
    assert names["event"] == Resource("", "v1", "events", "Event", True)  # from the kind
    assert names["events.events.k8s.io"].group == "events.k8s.io"
    assert names["no"] == names["node"] == Resource("", "v1", "nodes", "Node", False)
    assert "olds" not in names  # not the preferred version


def test_paths_are_those_of_the_api() -> None:
    pools = Resource("modelpool.dev", "v1alpha1", "modelpools", "ModelPool", True)
    assert pools.path("ns", "p") == "/apis/modelpool.dev/v1alpha1/namespaces/ns/modelpools/p"
    assert pools.api_version == "modelpool.dev/v1alpha1"
    nodes = Resource("", "v1", "nodes", "Node", False)
    assert nodes.path("ignored") == "/api/v1/nodes"


def test_managed_fields_are_dropped() -> None:
    obj = {"metadata": {"name": "x", "managedFields": [{}]}}
    assert kube_reads.strip_managed(obj) == {"metadata": {"name": "x"}}


@pytest.mark.parametrize(("status", "header", "seconds"), [
    (429, "1", 1), (429, "3", 3), (503, "2", 2), (429, "0", 1),
    (429, None, None), (429, "soon", None), (404, "1", None), (200, "1", None),
])
def test_an_answer_is_asked_again_after_its_retry_after_only_when_busy_or_failing(
        status: int, header: str | None, seconds: int | None) -> None:
    assert kube_reads.retry_after(status, header) == seconds
