"""A cluster installs modelpool from a registry, as a user's does from a release.

A registry (distribution v3, e2e/registry/) runs on this machine; `scripts/images --push`
builds the product's image and pushes it there; `scripts/release-manifest` writes the
install pinned to the digest pushed; the kind nodes' containerd is told to pull
`localhost:PORT/...` from this machine; `kubectl apply --server-side -f install.yaml`. The
reconciler and the router it renders then run the pulled image (nothing of it side-loaded
under that name), the examples-testbed pool serves and swaps through that router, `crictl
inspecti` on the nodes lists the image under the registry's name and the registry's log
shows the nodes resolving its manifest. A node that pulled the build still starts a pod of
its side-loaded name without pulling (a kubelet of 1.35 re-verifies an image by pulling it
again when a pod names it other than it was pulled, unless told not to: e2e/kind/up.sh).
Afterwards the cluster goes back to the install of
e2e/kind/up.sh (overlays/kind), as every other test expects it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from e2e import harness
from e2e.local.fixtures import Kubectl
from e2e.local.paths import REPO_ROOT
from e2e.registry import serve

pytestmark = [pytest.mark.timeout(600), pytest.mark.build("registry")]

SYSTEM = harness.SYSTEM_NAMESPACE
RECONCILER = harness.RECONCILER
# The product's image as e2e/kind/build-and-load.sh side-loads it on every node.
SIDE_LOADED = "ghcr.io/modelpool/modelpool:0.1.0"


def script(*argv: str, timeout: float = 300) -> str:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}"
    print(f"{Path(argv[1] if argv[0] == 'bash' else argv[0]).name}: "
          f"{time.monotonic() - started:.1f}s")
    return done.stdout


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[serve.Registry]:
    binary = Path(script("bash", str(REPO_ROOT / "e2e/registry/build.sh")).splitlines()[-1])
    with serve.running(binary, tmp_path / "registry") as running:
        yield running


@pytest.fixture
def nodes(kind_kubectl: Kubectl) -> list[str]:
    got = kind_kubectl.json("get", "nodes")["items"]
    return sorted(n["metadata"]["name"] for n in got)


@pytest.fixture
def pulling(kind_kubectl: Kubectl, registry: serve.Registry,
            nodes: list[str]) -> Iterator[None]:
    """The nodes pull `localhost:PORT/...` from the registry. Afterwards: the install of
    e2e/kind/up.sh again and the nodes' hosts file gone. The pulled references stay: they
    share their content with the side-loaded images (the same build), and removing one
    (`crictl rmi`) takes that content's other names with it on containerd 1.6, the
    side-loaded ones included. The next run pushes to another port, so its nodes resolve
    a new name from its registry."""
    serve.mirror_on_nodes(registry, nodes, f"{serve.gateway()}:{registry.port}")
    yield
    kind_kubectl("apply", "--server-side", "--force-conflicts", "-k",
                 str(REPO_ROOT / "overlays" / "kind"), timeout=120)
    kind_kubectl("-n", SYSTEM, "rollout", "status", f"deployment/{RECONCILER}",
                 "--timeout=180s", timeout=200)
    serve.unmirror_on_nodes(registry, nodes)


def repo_digests(node: str, reference: str) -> list[str]:
    """The digests `crictl inspecti` gives for `reference` on `node` (none where the node
    does not hold it). `crictl images` lists an image once per tag, so a digest-only
    reference to content that also has tags (the side-loaded copy) shows only here."""
    done = subprocess.run(["docker", "exec", node, "crictl", "inspecti", "-o", "json",
                           reference], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return []
    return list(json.loads(done.stdout)["status"].get("repoDigests") or [])


def pod_images(kubectl: Kubectl, namespace: str, selector: str) -> list[str]:
    """The image the spec names of each ready container of the pods `selector` picks. (The
    kubelet's imageID names whichever reference containerd holds for that content first:
    where the same image was also side-loaded, that name; the registry's log and `crictl
    inspecti` say what was pulled.)"""
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    out = []
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") is not None:
            continue
        spec = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        out += [spec[s["name"]] for s in (pod.get("status") or {}).get("containerStatuses") or []
                if s.get("ready")]
    return out


def starts_from_the_node(kubectl: Kubectl, namespace: str, node: str, image: str) -> str:
    """How a pod of `image` (IfNotPresent) pinned to `node` ends: "Completed" when it ran,
    else the reason it is waiting once that is a failure to get its image."""
    name = f"side-loaded-{node.rsplit('-', 1)[-1]}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeName": node, "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["/bin/true"],
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def ended() -> str | None:
        got = kubectl.json("get", "pod", name, "-n", namespace)
        for status in (got.get("status") or {}).get("containerStatuses") or []:
            state = status.get("state") or {}
            if "terminated" in state:
                return str(state["terminated"].get("reason"))
            waiting = (state.get("waiting") or {}).get("reason")
            if waiting in ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"):
                return f"{waiting}: {state['waiting'].get('message')}"
        return None

    try:
        return harness.eventually(ended, f"pod {name} of {image} on {node} ends", 60.0)
    finally:
        kubectl("delete", "pod", name, "-n", namespace, "--wait=false")


def test_an_install_from_pushed_images_serves_and_swaps(
    kind_kubectl: Kubectl, restricted_namespace: str, tmp_path: Path,
    registry: serve.Registry, nodes: list[str], pulling: None,
) -> None:
    kubectl, ns = kind_kubectl, restricted_namespace
    try:
        base = script("bash", str(REPO_ROOT / "e2e/kind/base-image.sh")).splitlines()[-1]
        images_file, install = tmp_path / "images.txt", tmp_path / "install.yaml"
        push = [str(REPO_ROOT / "scripts/images"), "--push", registry.name, "--base", base,
                "--record", str(images_file)]
        if base.startswith("modelpool/debian-root:"):
            push.append("--host-wheels")  # the offline root reaches no package index
        script(*push, timeout=600)
        script(str(REPO_ROOT / "scripts/release-manifest"), "--images", str(images_file),
               "--out", str(install))
        pinned = images_file.read_text().strip().split("=", 1)[1]
        assert pinned.startswith(f"{registry.name}/modelpool@sha256:"), pinned
        digest = pinned.split("@", 1)[1]

        # The user's command, as docs/install.md gives it. --force-conflicts: the fields
        # up.sh's install set are taken over, as an upgrade over another installer would.
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(install), timeout=120)
        kubectl("-n", SYSTEM, "rollout", "status", f"deployment/{RECONCILER}",
                "--timeout=180s", timeout=200)
        reconciler = pod_images(kubectl, SYSTEM, "app.kubernetes.io/name=modelpool-reconciler")
        assert reconciler and all(image == pinned for image in reconciler), reconciler

        harness.apply_examples(kubectl, ns, harness.EXAMPLES_TESTBED)
        harness.wait_pool_ready(kubectl, ns, "gpu0", resident="gemma", within=120)
        (router,) = harness.wait_router_ready(kubectl, ns, "chat", within=120)
        routers = pod_images(kubectl, ns, f"{harness.LABEL_ROUTER}=chat")
        assert routers and all(image == pinned for image in routers), routers
        with openai.OpenAI(base_url=harness.base_url(router), api_key="unused",
                           max_retries=0, timeout=120) as client:
            for model in ("gemma", "qwen"):
                reply = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "the pool"}],
                    max_tokens=4)
                assert reply.choices[0].message.content is not None
        status = harness.wait_pool_ready(kubectl, ns, "gpu0", resident="qwen", within=30)
        assert status["status"]["lastSwap"]["outcome"] == "Succeeded", status["status"]

        # Pulled, by the nodes, from this registry.
        held = {node: repo_digests(node, pinned) for node in nodes}
        assert any(pinned in digests for digests in held.values()), held
        pulls = registry.pulls_from(serve.node_addresses(nodes))
        assert f"/v2/modelpool/manifests/{digest}" in pulls, registry.log.read_text()[-3000:]

        # Where a node pulled the build from the registry, a pod of the side-loaded name of
        # the same build still starts from what the node holds, pulling nothing.
        for node in (n for n, digests in held.items() if pinned in digests):
            assert starts_from_the_node(kubectl, ns, node, SIDE_LOADED) == "Completed"
    finally:
        harness.remove_workloads(kubectl, ns)
