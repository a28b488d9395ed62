"""The pure parts of `modelpool-local`: certificates, kubeconfigs, command lines, paths."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import ipaddress
import logging
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from e2e.local import certs, components, controlplane, kubeconfig
from e2e.local.components import ClusterSettings, Ports
from e2e.local.paths import StateLayout, default_state_dir

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_apiserver_certificate_is_signed_by_the_ca_and_names_the_service() -> None:
    ca = certs.new_ca("test-ca", NOW)
    served = _cert(certs.issue(ca, certs.APISERVER, NOW).cert_pem)
    served.verify_directly_issued_by(_cert(ca.cert_pem))
    sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert {"localhost", "kubernetes.default"} <= set(sans.get_values_for_type(x509.DNSName))
    usage = served.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_admin_certificate_is_a_client_in_system_masters() -> None:
    ca = certs.new_ca("test-ca", NOW)
    admin = _cert(certs.issue(ca, certs.CLIENTS["admin"], NOW).cert_pem)
    orgs = [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert admin.not_valid_before_utc < NOW < admin.not_valid_after_utc


def test_ensure_pki_keeps_what_exists(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    certs.ensure_pki(layout, NOW)
    first = {p.name: p.read_bytes() for p in layout.pki.iterdir()}
    assert {"ca.crt", "apiserver.key", "admin.crt", "sa.pub", "sa.key"} <= set(first)
    certs.ensure_pki(layout, NOW)
    assert {p.name: p.read_bytes() for p in layout.pki.iterdir()} == first
    assert layout.key("admin").stat().st_mode & 0o077 == 0


def test_kubeconfig_embeds_the_credentials() -> None:
    text = kubeconfig.render("https://127.0.0.1:6443", b"CA", "me", b"CERT", b"KEY")
    config = yaml.safe_load(text)
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    assert base64.b64decode(user["client-key-data"]) == b"KEY"
    assert config["current-context"] == config["contexts"][0]["name"]


SETTINGS = ClusterSettings(
    bin_dir=Path("/bin-dir"), ports=Ports(2379, 2380, 6443, 10257, 10259), gpus=2
)


def test_apiserver_flags_enable_the_security_the_tests_rely_on() -> None:
    argv = components.apiserver(StateLayout(Path("/state")), SETTINGS).argv
    assert argv[0] == "/bin-dir/kube-apiserver"
    assert "--authorization-mode=Node,RBAC" in argv
    assert "--enable-admission-plugins=NodeRestriction" in argv
    assert "--secure-port=6443" in argv
    assert "--etcd-servers=http://127.0.0.1:2379" in argv
    assert "--service-account-signing-key-file=/state/pki/sa.key" in argv
    assert not any(a.startswith("--disable-admission-plugins") for a in argv)


def test_controller_manager_runs_the_controllers_the_project_needs() -> None:
    argv = components.controller_manager(StateLayout(Path("/state")), SETTINGS).argv
    flag = next(a for a in argv if a.startswith("--controllers="))
    enabled = set(flag.split("=", 1)[1].split(","))
    assert {
        "deployment-controller",
        "replicaset-controller",
        "endpointslice-controller",
        "garbage-collector-controller",
        "serviceaccount-token-controller",
    } <= enabled
    assert "--use-service-account-credentials=true" in argv


def test_node_agent_gets_the_admin_kubeconfig_and_the_gpu_count() -> None:
    argv = components.node_agent(StateLayout(Path("/state")), SETTINGS, "/py").argv
    assert argv[:3] == ("/py", "-m", "e2e.local.node_agent")
    assert "--kubeconfig=/state/admin.kubeconfig" in argv
    assert "--gpus=2" in argv
    assert "--state-dir=/state/node" in argv
    assert "--pod-network=127.1.0.0/16" in argv


def test_pod_networks_stay_off_the_control_planes_addresses() -> None:
    for _ in range(50):
        network = components.random_pod_network()
        second = int(network.split(".")[1])
        assert network.endswith(".0.0/16") and 10 <= second < 250


def test_settings_survive_the_state_file() -> None:
    assert ClusterSettings.from_json(SETTINGS.to_json()) == SETTINGS
    raised = dataclasses.replace(SETTINGS, api_qps=200)
    assert ClusterSettings.from_json(raised.to_json()) == raised


def test_the_controllers_client_rate_is_raised_only_when_asked() -> None:
    layout = StateLayout(Path("/state"))
    for make in (components.controller_manager, components.scheduler):
        assert not any(a.startswith("--kube-api-") for a in make(layout, SETTINGS).argv)
        argv = make(layout, dataclasses.replace(SETTINGS, api_qps=200)).argv
        assert "--kube-api-qps=200" in argv and "--kube-api-burst=300" in argv


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "/home/u/.local/state/modelpool/local"),
        ({"XDG_STATE_HOME": "/xdg"}, "/xdg/modelpool/local"),
        ({"XDG_STATE_HOME": ""}, "/home/u/.local/state/modelpool/local"),
    ],
)
def test_default_state_dir(env: dict[str, str], expected: str) -> None:
    assert default_state_dir(env, Path("/home/u")) == Path(expected)


class _FakeTime:
    """A clock that moves only when the wait sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_long_wait_says_what_it_waits_for_and_the_timeout_names_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _FakeTime()
    deadline = controlplane._Deadline(fake.clock, fake.now, 12.0, sleep=fake.sleep)
    caplog.set_level(logging.INFO, logger="e2e.local.controlplane")
    timed_out = r"timed out after 12s waiting for the scheduler"
    with pytest.raises(controlplane.ClusterError, match=timed_out):
        controlplane._wait(StateLayout(tmp_path), "the scheduler", lambda: False, [], deadline)
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert reports == [
        "waiting for the scheduler: 5s so far, 5s of the 12s deadline spent",
        "waiting for the scheduler: 10s so far, 10s of the 12s deadline spent",
    ]


def test_a_short_wait_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = _FakeTime()
    deadline = controlplane._Deadline(fake.clock, fake.now, 12.0, sleep=fake.sleep)
    answers = iter([False] * 8 + [True])
    caplog.set_level(logging.INFO, logger="e2e.local.controlplane")
    controlplane._wait(StateLayout(tmp_path), "the API server", lambda: next(answers), [], deadline)
    assert [r for r in caplog.records if r.getMessage().startswith("waiting for")] == []
