"""argv building, `$(VAR)` expansion, env resolution and mount-path rewriting."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from e2e.local.node_agent.podspec import (
    ConfigError,
    Mount,
    PodFacts,
    Sources,
    container_argv,
    container_env,
    expand,
    field_value,
    gpu_request,
    program_argv,
    referenced_objects,
    rewrite_paths,
)

pytestmark = pytest.mark.unit

PY = "/venv/bin/python"
FAKE = ("-m", "e2e.fake_model")


@pytest.mark.parametrize(
    ("command", "args", "argv"),
    [
        ([], [], [PY, *FAKE]),
        ([], ["--port", "9000"], [PY, *FAKE, "--port", "9000"]),
        (["/app/llama-server"], ["-m", "/m.gguf"], [PY, *FAKE, "-m", "/m.gguf"]),
        (["llama-server", "--host", "0.0.0.0"], ["--port", "8080"],
         [PY, *FAKE, "--host", "0.0.0.0", "--port", "8080"]),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], ["--port", "1"],
         [PY, *FAKE, "--model", "m", "--port", "1"]),
        (["/usr/bin/python", "-m", "vllm.entrypoints.openai.api_server"], [], [PY, *FAKE]),
    ],
)
def test_program_argv(command: list[str], args: list[str], argv: list[str]) -> None:
    assert program_argv(PY, FAKE, command, args) == argv


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1y2z"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$A", "$A"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("end$", "end$"),
        ("", ""),
    ],
)
def test_expand_follows_kubernetes(text: str, expanded: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expanded


MOUNTS = [
    Mount("/etc/modelpool/router", "/state/vol/config"),
    Mount("/etc/modelpool", "/state/vol/outer"),
    Mount("/models", "/data/models"),
]


@pytest.mark.parametrize(
    ("text", "rewritten"),
    [
        ("/etc/modelpool/router/config.json", "/state/vol/config/config.json"),
        ("--config=/etc/modelpool/router/config.json", "--config=/state/vol/config/config.json"),
        ("/etc/modelpool/other", "/state/vol/outer/other"),
        ("/models", "/data/models"),
        ("/models/a.gguf", "/data/models/a.gguf"),
        ("/models-extra/a", "/models-extra/a"),
        ("/x/models/a", "/x/models/a"),
        ("a:/models/b", "a:/data/models/b"),
        ("plain", "plain"),
    ],
)
def test_rewrite_paths_only_as_prefixes(text: str, rewritten: str) -> None:
    assert rewrite_paths(text, MOUNTS) == rewritten


def test_a_host_directory_put_in_is_not_rewritten_again() -> None:
    mounts = [Mount("/var/lib/kv", "/tmp/node/claims/kv"), Mount("/tmp", "/state/vol/tmp")]
    assert rewrite_paths("--slot-save-path /var/lib/kv/ /tmp/x", mounts) == (
        "--slot-save-path /tmp/node/claims/kv/ /state/vol/tmp/x")


FACTS = PodFacts(
    name="p",
    namespace="ns",
    uid="u-1",
    node_name="node-a",
    service_account="router",
    pod_ip="127.0.1.7",
    host_ip="127.0.0.1",
    labels={"app": "x"},
    annotations={"note": "y"},
)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("spec.nodeName", "node-a"),
        ("spec.serviceAccountName", "router"),
        ("status.podIP", "127.0.1.7"),
        ("status.hostIP", "127.0.0.1"),
        ("metadata.labels['app']", "x"),
        ("metadata.annotations['note']", "y"),
        ("metadata.labels", 'app="x"'),
    ],
)
def test_field_refs(path: str, value: str) -> None:
    assert field_value(path, FACTS) == value


def test_unsupported_field_ref_is_an_error() -> None:
    with pytest.raises(ConfigError):
        field_value("status.phase", FACTS)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


SOURCES = Sources(
    config_maps={"cfg": {"kind": "ConfigMap", "data": {"LEVEL": "debug", "MODE": "fast"}}},
    secrets={"creds": {"kind": "Secret", "data": {"TOKEN": _b64("s3cret")}}, "gone": None},
)


def test_env_from_every_source_in_kubelet_order() -> None:
    container: dict[str, Any] = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
                    {"secretRef": {"name": "creds"}}],
        "env": [
            {"name": "MODE", "value": "slow"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LEVEL"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "TOKEN"}}},
            {"name": "URL", "value": "http://$(IP):8080/$(POD)/$(UNDEFINED)"},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k",
                                                           "optional": True}}},
            {"name": "MODELPOOL_BIND_HOST", "value": "0.0.0.0"},
        ],
    }
    env = container_env(container, FACTS, SOURCES, {"MODELPOOL_BIND_HOST": "127.0.1.7"})
    assert env == {
        "CFG_LEVEL": "debug",
        "CFG_MODE": "fast",
        "TOKEN": "s3cret",
        "MODE": "slow",
        "POD": "p",
        "NS": "ns",
        "IP": "127.0.1.7",
        "NODE": "node-a",
        "SA": "router",
        "LVL": "debug",
        "PW": "s3cret",
        "URL": "http://127.0.1.7:8080/p/$(UNDEFINED)",
        "MODELPOOL_BIND_HOST": "127.0.1.7",
    }


@pytest.mark.parametrize(
    "var",
    [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}},
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "NOPE"}}},
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}},
    ],
)
def test_missing_required_reference_is_a_config_error(var: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        container_env({"env": [var]}, FACTS, SOURCES, {})


def test_argv_expands_env_then_rewrites_mounts() -> None:
    container = {
        "command": ["/app/llama-server"],
        "args": ["--model", "/models/$(MODEL).gguf", "--port", "$(PORT)", "--host", "$(IP)"],
    }
    env = {"MODEL": "qwen", "PORT": "8080", "IP": "127.0.1.7"}
    assert container_argv(PY, FAKE, container, env, MOUNTS) == [
        PY, *FAKE, "--model", "/data/models/qwen.gguf", "--port", "8080", "--host", "127.0.1.7",
    ]


def test_referenced_objects_cover_env_and_volumes() -> None:
    pod = {
        "spec": {
            "containers": [
                {"envFrom": [{"configMapRef": {"name": "a"}}, {"secretRef": {"name": "b"}}],
                 "env": [{"name": "X",
                          "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}
            ],
            "volumes": [
                {"name": "v1", "configMap": {"name": "d"}},
                {"name": "v2", "secret": {"secretName": "e"}},
                {"name": "v3", "projected": {"sources": [
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"serviceAccountToken": {"path": "t"}},
                ]}},
            ],
        }
    }
    assert referenced_objects(pod) == ({"a", "c", "d", "kube-root-ca.crt"}, {"b", "e"})


@pytest.mark.parametrize(
    ("resources", "count"),
    [
        ({}, 0),
        ({"limits": {"nvidia.com/gpu": 1}}, 1),
        ({"limits": {"nvidia.com/gpu": "2"}}, 2),
        ({"requests": {"nvidia.com/gpu": "1"}}, 1),
        ({"limits": {"cpu": "1"}}, 0),
    ],
)
def test_gpu_request(resources: dict[str, Any], count: int) -> None:
    assert gpu_request({"resources": resources}) == count
