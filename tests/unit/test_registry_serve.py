"""e2e/registry/serve.py's pure parts: the containerd hosts file and reading the pulls from
the registry's log (the registry itself runs in e2e/kind_tests/test_registry_install.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from e2e.registry import serve

DIGEST = "sha256:" + "ab" * 32


def test_the_hosts_file_sends_pulls_and_resolves_to_the_upstream_over_http() -> None:
    hosts = tomllib.loads(serve.hosts_toml("172.18.0.1:5000"))
    assert hosts["server"] == "http://172.18.0.1:5000"
    assert hosts["host"]["http://172.18.0.1:5000"]["capabilities"] == ["pull", "resolve"]


def test_pulls_are_the_manifests_resolved_or_served_to_the_given_addresses(tmp_path: Path) -> None:
    def line(method: str, remote: str, uri: str, status: int) -> str:
        return json.dumps({"http.request.method": method, "http.request.remoteaddr": remote,
                           "http.request.uri": uri, "http.response.status": status})

    log = tmp_path / "registry.log"
    log.write_text("\n".join([
        line("GET", "172.18.0.2:4100", f"/v2/modelpool/manifests/{DIGEST}?ns=localhost%3A5000",
             200),
        line("HEAD", "172.18.0.3:4100", f"/v2/modelpool/manifests/{DIGEST}", 200),
        line("GET", "127.0.0.1:4100", "/v2/modelpool/manifests/0.1.0", 200),  # this machine
        line("GET", "172.18.0.3:4100", "/v2/modelpool/manifests/missing", 404),
        line("GET", "172.18.0.3:4100", f"/v2/modelpool/blobs/{DIGEST}", 200),
        '127.0.0.1 - - [06/Dec/2026:07:54:14 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "x"',
    ]))
    registry = serve.Registry(5000, log)
    assert registry.name == "localhost:5000"
    assert registry.pulls_from(["172.18.0.2", "172.18.0.3"]) == [
        f"/v2/modelpool/manifests/{DIGEST}", f"/v2/modelpool/manifests/{DIGEST}"]
    assert registry.pulls_from(["172.18.0.9"]) == []


def test_the_registry_stores_under_its_state_directory_and_listens_everywhere(
        tmp_path: Path) -> None:
    config = json.loads(serve.config(5123, tmp_path))
    assert config["http"]["addr"] == "0.0.0.0:5123"
    assert config["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "data")
