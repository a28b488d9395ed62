"""The local node agent against the real control plane: pods run as processes with the
kubelet's env, volume, probe, restart and deletion rules (docs/contracts.md section 3).

The processes are local, so a test reads what a process really got from /proc (its
environment and argv) and the files its volumes became."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from e2e.local.fixtures import Kubectl

pytestmark = pytest.mark.integration

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def apply(kubectl: Kubectl, namespace: str, *objects: dict[str, Any]) -> None:
    for obj in objects:
        obj.setdefault("metadata", {})["namespace"] = namespace
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": list(objects)}))


def get_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = kubectl.json_or_none("get", "pod", name, "-n", namespace)
    return pod


def container_status(pod: dict[str, Any] | None, index: int = 0) -> dict[str, Any]:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return statuses[index] if len(statuses) > index else {}


def is_ready(pod: dict[str, Any] | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def running_pid(kubectl: Kubectl, namespace: str, name: str, timeout: float = 30.0) -> int:
    def pid() -> int | None:
        status = container_status(get_pod(kubectl, namespace, name))
        if "running" in status.get("state", {}) and status.get("containerID"):
            return int(str(status["containerID"]).removeprefix("local://"))
        return None

    return wait_for(f"pod {name} running", pid, timeout)


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def process_argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def fake_model_pod(name: str, *args: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "server",
                    "image": "modelpool/fake-model:test",
                    "args": ["--port", "8080", *args],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    **container,
                }
            ],
        },
    }


def test_env_from_config_map_secret_and_field_refs(kubectl: Kubectl, namespace: str) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                  "data": {"LEVEL": "debug", "EXTRA": "from-env-from"}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
              "stringData": {"TOKEN": "s3cret"}}
    field = {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
        "NODE_NAME": "spec.nodeName",
        "SA_NAME": "spec.serviceAccountName",
    }
    env = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field.items()]
    env += [
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LEVEL"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "TOKEN"}}},
        {"name": "URL", "value": "http://$(POD_IP):8080/$(POD_NAME)"},
    ]
    pod = fake_model_pod(
        "envy", env=env, envFrom=[{"configMapRef": {"name": "settings"}, "prefix": "CM_"}],
        resources={"limits": {"nvidia.com/gpu": 1}},
    )
    apply(kubectl, namespace, config_map, secret, pod)

    got = process_env(running_pid(kubectl, namespace, "envy"))
    status = get_pod(kubectl, namespace, "envy")
    assert status is not None
    pod_ip = status["status"]["podIP"]
    assert pod_ip.startswith("127.") and pod_ip != "127.0.0.1"
    assert got["POD_NAME"] == "envy"
    assert got["POD_NAMESPACE"] == namespace
    assert got["POD_IP"] == pod_ip
    assert got["NODE_NAME"] == status["spec"]["nodeName"]
    assert got["SA_NAME"] == "default"
    assert got["LEVEL"] == "debug"
    assert got["CM_EXTRA"] == "from-env-from"
    assert got["TOKEN"] == "s3cret"
    assert got["URL"] == f"http://{pod_ip}:8080/envy"
    assert got["MODELPOOL_BIND_HOST"] == pod_ip
    assert got["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert Path(got["MODELPOOL_GPU_LOCK_DIR"]).is_dir()
    assert Path(got["KUBECONFIG"]).is_file()
    assert Path(got["HOME"]) == Path(got["KUBECONFIG"]).parent


def test_config_map_volume_is_updated_in_place(kubectl: Kubectl, namespace: str) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "router"},
                  "data": {"config.json": '{"version": 1}'}}
    pod = fake_model_pod(
        "mounted", "--model", "/etc/modelpool/router/config.json",
        volumeMounts=[{"name": "config", "mountPath": "/etc/modelpool/router"}],
    )
    pod["spec"]["volumes"] = [{"name": "config", "configMap": {"name": "router"}}]
    apply(kubectl, namespace, config_map, pod)

    argv = process_argv(running_pid(kubectl, namespace, "mounted"))
    path = Path(argv[argv.index("--model") + 1])
    assert path.name == "config.json"
    assert not str(path).startswith("/etc/modelpool")
    assert json.loads(path.read_text()) == {"version": 1}

    kubectl("patch", "configmap", "router", "-n", namespace, "--type=merge",
            "-p", json.dumps({"data": {"config.json": '{"version": 2}'}}))
    wait_for("the file to follow the ConfigMap",
             lambda: json.loads(path.read_text()) == {"version": 2})


def test_readiness_gates_the_ready_condition(kubectl: Kubectl, namespace: str) -> None:
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1}
    apply(kubectl, namespace, fake_model_pod("slow", "--load-time", "6", readinessProbe=probe))
    start = time.monotonic()

    running = wait_for("the pod running", lambda: (
        pod if (pod := get_pod(kubectl, namespace, "slow"))
        and (pod.get("status") or {}).get("phase") == "Running" else None
    ))
    assert not is_ready(running), "ready before its readiness probe passed"
    assert container_status(running)["ready"] is False

    ready = wait_for("the pod ready", lambda: (
        pod if is_ready(pod := get_pod(kubectl, namespace, "slow")) else None
    ))
    assert time.monotonic() - start >= 5.5
    assert container_status(ready)["ready"] is True


def test_exited_container_restarts_and_counts(kubectl: Kubectl, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "crasher"},
        "spec": {
            "restartPolicy": "OnFailure",
            # The default ServiceAccount may not list secrets: the client exits 1.
            "containers": [{"name": "client", "image": "modelpool/testbed-client",
                            "args": ["list", "secrets"]}],
        },
    }
    apply(kubectl, namespace, pod)

    restarted = wait_for("a restart", lambda: (
        status if (status := container_status(get_pod(kubectl, namespace, "crasher")))
        .get("restartCount", 0) >= 1 else None
    ), timeout=60)
    assert restarted["lastState"]["terminated"]["exitCode"] == 1
    pod_now = get_pod(kubectl, namespace, "crasher")
    assert pod_now is not None
    assert pod_now["status"]["phase"] in ("Running", "Pending")


def test_deletion_keeps_the_pod_and_its_gpu_until_the_process_exits(
    kubectl: Kubectl, namespace: str
) -> None:
    gpu = {"limits": {"nvidia.com/gpu": 1}}
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1}
    holder = fake_model_pod("holder", "--unload-time", "4", resources=gpu, readinessProbe=probe)
    apply(kubectl, namespace, holder)
    pid = running_pid(kubectl, namespace, "holder")
    # Ready means the server is up and handles SIGTERM by unloading.
    wait_for("the holder ready", lambda: is_ready(get_pod(kubectl, namespace, "holder")))
    apply(kubectl, namespace, fake_model_pod("waiter", resources=gpu))

    kubectl("delete", "pod", "holder", "-n", namespace, "--wait=false")
    terminating = wait_for("the deletion to be seen", lambda: (
        pod if (pod := get_pod(kubectl, namespace, "holder"))
        and pod["metadata"].get("deletionTimestamp") else None
    ))
    assert terminating is not None
    deleted_at = time.monotonic()
    # While the holder unloads, its process lives, it keeps the GPU and the pod object stays.
    while time.monotonic() - deleted_at < 2.5:
        assert Path(f"/proc/{pid}").exists()
        assert get_pod(kubectl, namespace, "holder") is not None
        waiter = get_pod(kubectl, namespace, "waiter")
        assert waiter is not None and waiter["status"].get("phase") == "Pending"
        time.sleep(0.3)

    wait_for("the holder pod gone", lambda: get_pod(kubectl, namespace, "holder") is None)
    assert time.monotonic() - deleted_at >= 3.0
    assert not Path(f"/proc/{pid}").exists()
    running_pid(kubectl, namespace, "waiter")


def test_unknown_image_fails_the_pod_naming_the_image(kubectl: Kubectl, namespace: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mystery"},
           "spec": {"containers": [{"name": "c", "image": "example.com/team/mystery:1.0"}]}}
    apply(kubectl, namespace, pod)
    failed = wait_for("the pod Failed", lambda: (
        p if (p := get_pod(kubectl, namespace, "mystery"))
        and (p.get("status") or {}).get("phase") == "Failed" else None
    ))
    assert failed["status"]["reason"] == "UnknownImage"
    assert "example.com/team/mystery:1.0" in failed["status"]["message"]
    waiting = container_status(failed)["state"]["waiting"]
    assert waiting["reason"] == "UnknownImage"
    assert "example.com/team/mystery:1.0" in waiting["message"]


def pod_reader(namespace: str) -> list[dict[str, Any]]:
    """A ServiceAccount `reader` that may list pods and nothing else."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-reader"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "pod-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]},
    ]


def test_pod_process_has_its_service_accounts_rights(kubectl: Kubectl, namespace: str) -> None:
    rbac = pod_reader(namespace)

    def client(name: str, *args: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"serviceAccountName": "reader", "restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "modelpool/testbed-client",
                                         "args": list(args),
                                         "terminationMessagePolicy": "FallbackToLogsOnError"}]}}

    apply(kubectl, namespace, *rbac)
    tokenless = client("tokenless", "list", "pods")
    tokenless["spec"]["automountServiceAccountToken"] = False
    apply(kubectl, namespace, client("lists-pods", "list", "pods"),
          client("lists-secrets", "list", "secrets"), tokenless)

    def phase(name: str) -> str | None:
        pod = get_pod(kubectl, namespace, name)
        value = ((pod or {}).get("status") or {}).get("phase")
        return value if value in ("Succeeded", "Failed") else None

    assert wait_for("the pods client to finish", lambda: phase("lists-pods")) == "Succeeded"
    assert wait_for("the secrets client to finish", lambda: phase("lists-secrets")) == "Failed"
    terminated = container_status(get_pod(kubectl, namespace, "lists-secrets"))["state"]
    assert terminated["terminated"]["message"].strip() == "FORBIDDEN"
    # No token, no credentials: not even the agent's own through a shared HOME.
    assert wait_for("the tokenless client to finish", lambda: phase("tokenless")) == "Failed"
    terminated = container_status(get_pod(kubectl, namespace, "tokenless"))["state"]
    assert terminated["terminated"]["message"].startswith("ERROR no KUBECONFIG")


def test_failed_liveness_probe_restarts_the_container(kubectl: Kubectl, namespace: str) -> None:
    probe = {"httpGet": {"path": "/no-such-path", "port": 8080}, "periodSeconds": 1,
             "failureThreshold": 2, "initialDelaySeconds": 1}
    apply(kubectl, namespace, fake_model_pod("unwell", livenessProbe=probe))
    first = running_pid(kubectl, namespace, "unwell")

    restarted = wait_for("a liveness restart", lambda: (
        status if (status := container_status(get_pod(kubectl, namespace, "unwell")))
        .get("restartCount", 0) >= 1 and "running" in status.get("state", {}) else None
    ), timeout=60)
    assert "terminated" in restarted["lastState"]
    assert restarted["containerID"] != f"local://{first}"



def test_init_container_completes_before_the_server_starts(
    kubectl: Kubectl, namespace: str
) -> None:
    pod = fake_model_pod("initialised")
    pod["spec"]["serviceAccountName"] = "reader"
    pod["spec"]["initContainers"] = [
        {"name": "check", "image": "modelpool/testbed-client", "args": ["list", "pods"]}
    ]
    apply(kubectl, namespace, *pod_reader(namespace))
    apply(kubectl, namespace, pod)

    running_pid(kubectl, namespace, "initialised")
    status = get_pod(kubectl, namespace, "initialised")
    assert status is not None
    [init] = status["status"]["initContainerStatuses"]
    finished = init["state"]["terminated"]
    assert (finished["exitCode"], finished["reason"]) == (0, "Completed")
    started = container_status(status)["state"]["running"]["startedAt"]
    assert started >= finished["finishedAt"]
    conditions = {c["type"]: c["status"] for c in status["status"]["conditions"]}
    assert conditions["Initialized"] == "True"


def test_agent_registers_its_node_and_stops_its_pods_on_sigterm(
    kubectl: Kubectl, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    node = f"{namespace}-node"
    argv = [sys.executable, "-m", "e2e.local.node_agent", f"--kubeconfig={kubeconfig}",
            f"--node-name={node}", "--gpus=2", f"--state-dir={tmp_path / 'state'}",
            "--pod-network=127.254.0.0/16", "--unschedulable"]
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        def ready_node() -> dict[str, Any] | None:
            found: dict[str, Any] | None = kubectl.json_or_none("get", "node", node)
            if found is None:
                return None
            conditions = found.get("status", {}).get("conditions") or []
            ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return found if ok else None

        registered = wait_for("the node Ready", ready_node)
        assert registered["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        assert registered["status"]["capacity"]["nvidia.com/gpu"] == "2"
        assert {"type": "InternalIP", "address": "127.0.0.1"} in registered["status"]["addresses"]
        assert registered["spec"]["unschedulable"] is True
        # The Lease comes from a loop of its own, as a kubelet's does: no order between the
        # two, so it is waited for too.
        lease = wait_for("the node's Lease", lambda: kubectl.json_or_none(
            "get", "lease", node, "-n", "kube-node-lease"))
        assert lease["spec"]["holderIdentity"] == node

        probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1}
        pod = fake_model_pod("pinned", "--unload-time", "1", readinessProbe=probe,
                             resources={"limits": {"nvidia.com/gpu": 2}})
        pod["spec"]["nodeName"] = node
        apply(kubectl, namespace, pod)
        pid = running_pid(kubectl, namespace, "pinned")
        ready = wait_for("the pinned pod ready", lambda: (
            p if is_ready(p := get_pod(kubectl, namespace, "pinned")) else None
        ))
        assert ready["status"]["podIP"].startswith("127.254.")
        assert process_env(pid)["NVIDIA_VISIBLE_DEVICES"] == "0,1"

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
        assert not Path(f"/proc/{pid}").exists()
        # The agent stopped its pods but deleted nothing: a restarted agent runs them again.
        after = get_pod(kubectl, namespace, "pinned")
        assert after is not None and not after["metadata"].get("deletionTimestamp")
        assert "node agent stopped" in (tmp_path / "agent.log").read_text()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        kubectl("delete", "pod", "pinned", "-n", namespace, "--grace-period=0", "--force",
                "--ignore-not-found", check=False)
        kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)


def test_process_outliving_its_grace_period_is_killed(kubectl: Kubectl, namespace: str) -> None:
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1}
    pod = fake_model_pod("stubborn", "--unload-time", "30", readinessProbe=probe)
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    apply(kubectl, namespace, pod)
    pid = running_pid(kubectl, namespace, "stubborn")
    wait_for("the pod ready", lambda: is_ready(get_pod(kubectl, namespace, "stubborn")))

    started = time.monotonic()
    kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false")
    wait_for("the pod gone", lambda: get_pod(kubectl, namespace, "stubborn") is None, timeout=15)
    assert time.monotonic() - started < 10, "the 30 s unload was not cut short by SIGKILL"
    assert not Path(f"/proc/{pid}").exists()


def test_startup_probe_holds_started_and_ready(kubectl: Kubectl, namespace: str) -> None:
    startup = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1,
               "failureThreshold": 30}
    # A liveness probe that would fail during loading must wait for the startup probe.
    liveness = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1,
                "failureThreshold": 1}
    apply(kubectl, namespace, fake_model_pod("starter", "--load-time", "6",
                                             startupProbe=startup, livenessProbe=liveness))
    running_pid(kubectl, namespace, "starter")
    early = container_status(get_pod(kubectl, namespace, "starter"))
    assert early["started"] is False and early["ready"] is False

    started = wait_for("the container started", lambda: (
        status if (status := container_status(get_pod(kubectl, namespace, "starter")))
        .get("started") else None
    ))
    assert started["ready"] is True
    assert started["restartCount"] == 0


def test_force_deleted_pod_has_its_process_killed(kubectl: Kubectl, namespace: str) -> None:
    apply(kubectl, namespace, fake_model_pod("vanishing", "--unload-time", "30"))
    pid = running_pid(kubectl, namespace, "vanishing")
    kubectl("delete", "pod", "vanishing", "-n", namespace, "--grace-period=0", "--force")
    assert get_pod(kubectl, namespace, "vanishing") is None
    wait_for("the process gone", lambda: not Path(f"/proc/{pid}").exists(), timeout=20)
