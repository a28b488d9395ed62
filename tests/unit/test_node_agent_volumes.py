"""Volume contents, the atomic writer and the pod kubeconfig."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.local.node_agent.files import current_files, write_atomically, write_file_atomically
from e2e.local.node_agent.podspec import ConfigError, PodFacts, Sources
from e2e.local.node_agent.settings import api_server_from_kubeconfig
from e2e.local.node_agent.volumes import (
    TokenSource,
    claim_path,
    plan_volume,
    token_kubeconfig,
    token_sources,
)

pytestmark = pytest.mark.unit

FACTS = PodFacts(name="p", namespace="ns", uid="u", node_name="n", service_account="sa",
                 pod_ip="127.0.1.2", host_ip="127.0.0.1", labels={"a": "b"}, annotations={})
SOURCES = Sources(
    config_maps={"cfg": {"kind": "ConfigMap", "data": {"config.json": "{}", "other": "x"},
                         "binaryData": {"bin": base64.b64encode(b"\x00\x01").decode()}},
                 "kube-root-ca.crt": None},
    secrets={"s": {"kind": "Secret", "data": {"key": base64.b64encode(b"v").decode()}}},
)
TOKEN = TokenSource(audience="", expiration_seconds=3607)


def plan(volume: dict[str, Any]) -> Any:
    return plan_volume(volume, FACTS, SOURCES, {"c": {}}, {TOKEN: "tok"}, b"CA")


def test_config_map_all_keys_and_binary() -> None:
    assert plan({"name": "v", "configMap": {"name": "cfg"}}).files == {
        "config.json": b"{}", "other": b"x", "bin": b"\x00\x01",
    }


def test_config_map_items_pick_and_rename() -> None:
    volume = {"name": "v", "configMap": {"name": "cfg",
                                         "items": [{"key": "config.json", "path": "a/c.json"}]}}
    assert plan(volume).files == {"a/c.json": b"{}"}


def test_secret_is_decoded() -> None:
    assert plan({"name": "v", "secret": {"secretName": "s"}}).files == {"key": b"v"}


def test_missing_config_map_is_an_error_unless_optional() -> None:
    with pytest.raises(ConfigError, match="absent"):
        plan({"name": "v", "configMap": {"name": "absent"}})
    assert plan({"name": "v", "configMap": {"name": "absent", "optional": True}}).files == {}


def test_downward_api_and_empty_dir_and_host_path() -> None:
    volume = {"name": "v", "downwardAPI": {"items": [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
    ]}}
    assert plan(volume).files == {"name": b"p", "labels": b'a="b"'}
    assert plan({"name": "e", "emptyDir": {}}).kind == "empty"
    host = plan({"name": "h", "hostPath": {"path": "/data"}})
    assert (host.kind, host.host_path) == ("host", "/data")


def test_service_account_projected_volume() -> None:
    volume = {"name": "kube-api-access-x", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}
    assert token_sources(volume) == [TOKEN]
    assert plan(volume).files == {"token": b"tok", "ca.crt": b"CA", "namespace": b"ns"}


def test_unsupported_volume_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unsupported"):
        plan({"name": "v", "nfs": {"server": "x"}})


def test_atomic_writer_swaps_the_whole_set(tmp_path: Path) -> None:
    directory = tmp_path / "vol"
    assert write_atomically(directory, {"a": b"1", "sub/b": b"2"})
    assert (directory / "a").read_bytes() == b"1"
    assert (directory / "sub" / "b").read_bytes() == b"2"
    assert not write_atomically(directory, {"a": b"1", "sub/b": b"2"})
    first = os.readlink(directory / "..data")
    assert write_atomically(directory, {"a": b"3"})
    assert os.readlink(directory / "..data") != first
    assert (directory / "a").read_bytes() == b"3"
    assert not (directory / "sub").exists()
    assert current_files(directory) == {"a": b"3"}
    assert not (directory / first).exists()


def test_single_file_write(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    assert write_file_atomically(path, b"x")
    assert not write_file_atomically(path, b"x")
    assert path.read_bytes() == b"x"
    assert path.stat().st_mode & 0o777 == 0o600


def test_kubeconfig_carries_server_ca_token_and_namespace() -> None:
    config = token_kubeconfig("https://127.0.0.1:6443", "Q0E=", "tok", "ns")
    parsed = yaml.safe_load(yaml.safe_dump(config))
    assert parsed["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E=",
    }
    assert parsed["users"][0]["user"] == {"token": "tok"}
    assert parsed["contexts"][0]["context"]["namespace"] == "ns"


def test_api_server_from_admin_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"PEM")
    config = {
        "current-context": "admin",
        "contexts": [{"name": "admin", "context": {"cluster": "local", "user": "admin"}}],
        "clusters": [{"name": "local", "cluster": {"server": "https://127.0.0.1:16443",
                                                   "certificate-authority": "ca.crt"}}],
    }
    server = api_server_from_kubeconfig(config, tmp_path)
    assert server.server == "https://127.0.0.1:16443"
    assert server.ca_pem == b"PEM"


def test_claim_volume_resolves_to_the_bound_volume_or_a_node_directory() -> None:
    claim = plan({"name": "m", "persistentVolumeClaim": {"claimName": "weights"}})
    assert (claim.kind, claim.claim) == ("claim", "weights")
    host_pv = {"spec": {"hostPath": {"path": "/data/weights"}}}
    local_pv = {"spec": {"local": {"path": "/mnt/disk"}}}
    other_pv = {"spec": {"csi": {"driver": "x"}}}
    assert claim_path(host_pv, "/state/claims", "ns", "weights") == "/data/weights"
    assert claim_path(local_pv, "/state/claims", "ns", "weights") == "/mnt/disk"
    assert claim_path(other_pv, "/state/claims", "ns", "weights") == "/state/claims/ns_weights"
    assert claim_path(None, "/state/claims", "ns", "weights") == "/state/claims/ns_weights"
