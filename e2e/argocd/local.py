"""Argo CD's application controller and repo server, with Redis, beside a cluster of the
local testbed: built by build.sh, run as processes the way Argo CD's own e2e setup runs
them (ARGOCD_FAKE_IN_CLUSTER: the in-cluster destination is the kubeconfig's cluster),
syncing from a git repository made from this checkout's working tree (`file://`, which the
repo server clones like any other URL).

    with started(kubectl, state_dir) as argo:
        argo.apply_applications()
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.fake_model.harness import free_port
from e2e.harness import KubectlLike, eventually, wait_established
from e2e.local.paths import REPO_ROOT

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build.sh"
NAMESPACE = "argocd"
APPLICATIONS = ("modelpool", "modelpool-examples")
REFRESH = "argocd.argoproj.io/refresh"

Json = dict[str, Any]


def build() -> Path:
    """The directory build.sh prints (the binary and the CRDs), building on a cold cache."""
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600,
                          check=False)
    assert done.returncode == 0, f"{BUILD} failed:\n{done.stderr[-4000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


def _git(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    identity = {"GIT_AUTHOR_NAME": "modelpool", "GIT_AUTHOR_EMAIL": "e2e@modelpool.invalid",
                "GIT_COMMITTER_NAME": "modelpool", "GIT_COMMITTER_EMAIL": "e2e@modelpool.invalid"}
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          env={**os.environ, **identity, **(env or {})}, check=False,
                          timeout=120)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def repository_of_working_tree(bare: Path) -> str:
    """A bare repository at `bare` whose branch main is one commit of this checkout's
    working tree as it is on disk (what .gitignore excludes left out); the checkout's own
    index and refs are not touched. Returns the commit."""
    _git("init", "-q", "--bare", str(bare), cwd=REPO_ROOT)
    index = bare / "modelpool-index"
    env = {"GIT_INDEX_FILE": str(index)}
    _git("add", "-A", ".", cwd=REPO_ROOT, env=env)
    tree = _git("write-tree", cwd=REPO_ROOT, env=env)
    commit = _git("commit-tree", tree, "-m", "modelpool: the working tree", cwd=REPO_ROOT,
                  env=env)
    index.unlink()
    _git("push", "-q", "--force", str(bare), f"{commit}:refs/heads/main", cwd=REPO_ROOT)
    return commit


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class ArgoCD:
    kubectl: KubectlLike
    repo_url: str
    revision: str
    logs: Path

    def apply_applications(self) -> None:
        text = (HERE / "applications.yaml").read_text().replace("REPO_URL", self.repo_url)
        self.kubectl("apply", "--server-side", "-f", "-", input=text)

    def application(self, name: str) -> Json:
        app: Json = self.kubectl.json("get", "application", name, "-n", NAMESPACE)
        return app

    def refresh(self, name: str, within: float = 60.0) -> Json:
        """A hard refresh (the manifests generated again from git, the live state compared
        again), as `argocd app get --hard-refresh` asks for it; returns the Application
        once the controller has done it (it removes the annotation when it has)."""
        self.kubectl("annotate", "application", name, "-n", NAMESPACE, f"{REFRESH}=hard",
                     "--overwrite")

        def refreshed() -> Json | None:
            app = self.application(name)
            return app if REFRESH not in (app["metadata"].get("annotations") or {}) else None

        return eventually(refreshed, f"Argo CD refreshing {name}", within, explain=self.tail)

    def tail(self, lines: int = 30) -> str:
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)


@contextlib.contextmanager
def started(kubectl: KubectlLike, state: Path) -> Iterator[ArgoCD]:
    """Argo CD installed into the cluster of `kubectl` (its CRDs, install.yaml) and its
    processes running until the block ends; `state` holds its files and logs."""
    kubeconfig, kubectl_binary = kubectl.kubeconfig, kubectl.binary
    built = build()
    for crd in sorted((built / "crds").glob("*.yaml")):
        kubectl("apply", "--server-side", "-f", str(crd))
    wait_established(kubectl, ["applications.argoproj.io", "appprojects.argoproj.io"])
    kubectl("apply", "--server-side", "-f", str(HERE / "install.yaml"))

    # The components read their namespace from the kubeconfig's context.
    config = state / "argocd.kubeconfig"
    config.write_text(kubeconfig.read_text())
    subprocess.run([kubectl_binary, f"--kubeconfig={config}", "config", "set-context",
                    "--current", f"--namespace={NAMESPACE}"], check=True, capture_output=True)
    revision = repository_of_working_tree(state / "modelpool.git")
    logs = state / "logs"
    for d in ("logs", "tls", "ssh", "gnupg", "tmp"):
        (state / d).mkdir(exist_ok=True)
    redis, repo, repo_metrics, controller_metrics = (free_port() for _ in range(4))
    env = {
        **os.environ,
        "KUBECONFIG": str(config),
        "ARGOCD_FAKE_IN_CLUSTER": "true",
        "ARGOCD_GPG_ENABLED": "false",
        "ARGOCD_GNUPGHOME": str(state / "gnupg"),
        "ARGOCD_TLS_DATA_PATH": str(state / "tls"),
        "ARGOCD_SSH_DATA_PATH": str(state / "ssh"),
        "TMPDIR": str(state / "tmp"),
        "KUBECTL": kubectl_binary,  # what bin/kustomize runs
        "PATH": os.pathsep.join([str(HERE / "bin"), str(built / "bin"),
                                 os.environ.get("PATH", "")]),
    }
    commands = {
        "redis": (["redis-server", "--port", str(redis), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no"], {}),
        "repo-server": ([str(built / "argocd"), "--port", str(repo), "--metrics-port",
                         str(repo_metrics), "--redis", f"127.0.0.1:{redis}",
                         "--loglevel", "info"],
                        {"ARGOCD_BINARY_NAME": "argocd-repo-server"}),
        "application-controller": (
            [str(built / "argocd"), "--redis", f"127.0.0.1:{redis}", "--repo-server",
             f"127.0.0.1:{repo}", "--metrics-port",
             str(controller_metrics), "--app-resync", "30", "--loglevel", "info"],
            {"ARGOCD_BINARY_NAME": "argocd-application-controller"}),
    }
    processes: list[subprocess.Popen[bytes]] = []
    argo = ArgoCD(kubectl, f"file://{state / 'modelpool.git'}", revision, logs)
    try:
        for name, (argv, extra) in commands.items():
            with (logs / f"{name}.log").open("wb") as out:
                processes.append(subprocess.Popen(argv, env={**env, **extra}, stdout=out,
                                                  stderr=subprocess.STDOUT, cwd=state))
        def serving(port: int) -> bool | None:
            exited = [name for name, p in zip(commands, processes, strict=False)
                      if p.poll() is not None]
            assert not exited, f"{exited} exited: {argo.tail()}"
            return True if _answers(f"http://127.0.0.1:{port}/metrics") else None

        for port in (repo_metrics, controller_metrics):
            eventually(functools.partial(serving, port), f"Argo CD serving on {port}", 60,
                       explain=argo.tail)
        yield argo
    finally:
        for p in reversed(processes):
            p.terminate()
        for p in processes:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
