"""`kubectl get ... -o json` answered in the test process, over one kept-alive connection;
and the two writes every test's namespace takes (`create`, `delete`).

The harness reads the cluster in every wait, about once a second per waiting test: run as
`kubectl`, each read is a process of its own (some 90 ms of CPU, a kubeconfig and a
discovery cache read, a TLS handshake the API server pays for too). `Reads.get(args)`
answers the common shapes of those reads itself, with the same credentials and the same
output `kubectl` prints:

    get KIND [NAME...] [-n NS] [-l SELECTOR] [--field-selector S] [--show-managed-fields]

KIND is a resource's plural, singular, short name or `plural.group`, resolved as kubectl
does (the core group first, then the others in the API server's order; the preferred
version), from the API server's aggregated discovery, fetched again once when a name is not
found in it (a CRD installed since). One NAME gives the object; none or several give a
`List` whose items carry their `apiVersion` and `kind`. `metadata.managedFields` is dropped
unless asked for, as kubectl does. A refusal is raised as kubectl's exit would be, with the
API server's reason and message.

Any other shape (`-A`, `-o` of another kind, `kind/name`, several kinds, a kubeconfig with
an exec plugin) gets None, and the caller runs kubectl.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import tempfile
import threading
import time
import urllib.parse
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DISCOVERY_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
)
VALUED = {"-n": "namespace", "--namespace": "namespace", "-l": "selector",
          "--selector": "selector", "--field-selector": "fields"}
FLAGS = {"--show-managed-fields": "managed"}


class Unsupported(Exception):
    """A read this module leaves to kubectl."""


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
        base += f"/{self.plural}"
        return base + (f"/{urllib.parse.quote(name, safe='')}" if name is not None else "")


@dataclass(frozen=True)
class Query:
    resource: str
    names: tuple[str, ...]
    namespace: str | None = None
    selector: str | None = None
    fields: str | None = None
    managed: bool = False


def parse(args: Sequence[str]) -> Query:
    """The query of kubectl's `args` (`get` first), or Unsupported."""
    if not args or args[0] != "get":
        raise Unsupported("not a get")
    positional: list[str] = []
    options: dict[str, Any] = {}
    rest = list(args[1:])
    while rest:
        token = rest.pop(0)
        if token.startswith("-"):
            flag, eq, value = token.partition("=")
            if flag in VALUED:
                if not eq:
                    if not rest:
                        raise Unsupported(f"{flag} without a value")
                    value = rest.pop(0)
                options[VALUED[flag]] = value
            elif token in FLAGS:
                options[FLAGS[token]] = True
            else:
                raise Unsupported(f"option {token}")
        else:
            positional.append(token)
    if not positional:
        raise Unsupported("no resource")
    resource, *names = positional
    if "," in resource or "/" in resource or any("/" in n for n in names):
        raise Unsupported(f"resource {resource}")
    if names and (options.get("selector") or options.get("fields")):
        raise Unsupported("names with a selector")
    return Query(resource.lower(), tuple(names), **options)


def resources_of(documents: Sequence[Mapping[str, Any]]) -> dict[str, Resource]:
    """Every name kubectl resolves (plural, singular, short names, `plural.group`,
    `singular.group`) to its resource, from aggregated discovery documents (`/api` first,
    then `/apis`); the first to claim a name keeps it, as kubectl's priority does."""
    names: dict[str, Resource] = {}
    for document in documents:
        for group in document.get("items") or []:
            group_name = str((group.get("metadata") or {}).get("name") or "")
            versions = group.get("versions") or []
            if not versions:
                continue
            preferred = versions[0]
            for r in preferred.get("resources") or []:
                plural = str(r["resource"])
                kind = str((r.get("responseKind") or {}).get("kind") or "")
                resource = Resource(group_name, str(preferred["version"]), plural, kind,
                                    r.get("scope") == "Namespaced")
                singular = str(r.get("singularResource") or kind.lower())
                aliases = [plural, singular, *(r.get("shortNames") or [])]
                if group_name:
                    aliases += [f"{plural}.{group_name}", f"{singular}.{group_name}"]
                for alias in aliases:
                    names.setdefault(alias.lower(), resource)
    return names


def strip_managed(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return obj


@dataclass(frozen=True)
class Credentials:
    server: str
    context: ssl.SSLContext
    token: str | None
    namespace: str


def _pem(user_or_cluster: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    if user_or_cluster.get(f"{key}-data"):
        return base64.b64decode(user_or_cluster[f"{key}-data"])
    if user_or_cluster.get(key):
        return (base / str(user_or_cluster[key])).read_bytes()
    return None


def credentials(kubeconfig: Path) -> Credentials:
    """The current context's server, TLS and identity, or Unsupported."""
    config = yaml.safe_load(kubeconfig.read_text())
    current = config.get("current-context")
    context = next(c["context"] for c in config["contexts"] if c["name"] == current)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    users = [u["user"] for u in config.get("users") or [] if u["name"] == context.get("user")]
    user: dict[str, Any] = (users[0] if users else None) or {}
    if set(user) - {"client-certificate-data", "client-key-data", "client-certificate",
                    "client-key", "token"}:
        raise Unsupported(f"kubeconfig user with {sorted(user)}")
    server = str(cluster["server"])
    if not server.startswith("https://"):
        raise Unsupported(f"server {server}")
    tls = ssl.create_default_context()
    ca = _pem(cluster, "certificate-authority", kubeconfig.parent)
    if ca is None:
        raise Unsupported("no certificate authority")
    tls.load_verify_locations(cadata=ca.decode())
    cert = _pem(user, "client-certificate", kubeconfig.parent)
    key = _pem(user, "client-key", kubeconfig.parent)
    if cert is not None and key is not None:
        with tempfile.TemporaryDirectory() as directory:
            pair = Path(directory) / "client.pem"
            pair.write_bytes(cert + b"\n" + key)
            tls.load_cert_chain(pair)
    return Credentials(server, tls, user.get("token"), context.get("namespace") or "default")


def _close_all(connections: list[http.client.HTTPSConnection]) -> None:
    for connection in connections:
        connection.close()
    connections.clear()


class Failed(Exception):
    """The API server answered a read with an error (kubectl's `Error from server`)."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            parsed = json.loads(body)
            reason, message = parsed.get("reason") or "Unknown", parsed.get("message") or ""
        except ValueError:
            reason, message = str(status), body.decode(errors="replace")
        super().__init__(f"Error from server ({reason}): {message}")
        self.status = status


class Reads:
    """Reads of one kubeconfig's cluster; safe to use from several threads."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._credentials: Credentials | None = None
        self._resources: dict[str, Resource] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        # Every thread's connection, closed by close() or when this object is collected.
        self._connections: list[http.client.HTTPSConnection] = []
        self._finalizer = weakref.finalize(self, _close_all, self._connections)

    def close(self) -> None:
        self._finalizer()

    def get(self, args: Sequence[str]) -> Any:
        """kubectl's output for `args`, None where kubectl must answer; raises Failed."""
        try:
            query = parse(args)
            resource = self._resource(query.resource)
        except Unsupported:
            return None
        namespace = (query.namespace or self._creds().namespace) if resource.namespaced else None
        if len(query.names) == 1:
            obj = self._request(resource.path(namespace, query.names[0]))
            return obj if query.managed else strip_managed(obj)
        if query.names:
            items = [self._request(resource.path(namespace, n)) for n in query.names]
        else:
            params = {k: v for k, v in (("labelSelector", query.selector),
                                        ("fieldSelector", query.fields)) if v}
            suffix = f"?{urllib.parse.urlencode(params)}" if params else ""
            listed = self._request(resource.path(namespace) + suffix)
            items = list(listed.get("items") or [])
            for item in items:
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
        if not query.managed:
            items = [strip_managed(i) for i in items]
        return {"apiVersion": "v1", "items": items, "kind": "List",
                "metadata": {"resourceVersion": ""}}

    def _creds(self) -> Credentials:
        with self._lock:
            if self._credentials is None:
                try:
                    self._credentials = credentials(self.kubeconfig)
                except (KeyError, StopIteration, TypeError, ValueError, OSError) as e:
                    raise Unsupported(f"kubeconfig {self.kubeconfig}: {e}") from e
            return self._credentials

    def _resource(self, name: str) -> Resource:
        with self._lock:
            found = self._resources.get(name)
        if found is None:
            documents = [self._request("/api", DISCOVERY_ACCEPT),
                         self._request("/apis", DISCOVERY_ACCEPT)]
            if any(d.get("kind") != "APIGroupDiscoveryList" for d in documents):
                raise Unsupported("no aggregated discovery")
            with self._lock:
                self._resources = resources_of(documents)
                found = self._resources.get(name)
        if found is None:
            raise Unsupported(f"no resource named {name}")
        return found

    def _connection(self, creds: Credentials) -> http.client.HTTPSConnection:
        connection: http.client.HTTPSConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            url = urllib.parse.urlsplit(creds.server)
            connection = http.client.HTTPSConnection(
                url.hostname or "127.0.0.1", url.port or 443, context=creds.context, timeout=60)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _request(self, path: str, accept: str = "application/json") -> dict[str, Any]:
        """The JSON the API server answers a GET of `path` with. An answer of 429 or 5xx
        with a Retry-After header is asked again after that many seconds, up to
        MAX_RETRIES times, as kubectl's client does (a CRD just established answers 429,
        `storage is (re)initializing`, until its watch cache is ready)."""
        for attempt in range(1, MAX_RETRIES + 1):
            status, body, retry_after = self._send(path, accept)
            if status == 200 or retry_after is None or attempt == MAX_RETRIES:
                break
            time.sleep(retry_after)  # the wait the API server asked for
        if status != 200:
            raise Failed(status, body)
        parsed: dict[str, Any] = json.loads(body)
        return parsed

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST `obj` to the collection at `path` (`kubectl create`); the object created.
        Raises Failed with the API server's refusal (AlreadyExists, Invalid, Forbidden...)."""
        status, body, _ = self._send(path, "application/json", "POST", json.dumps(obj).encode())
        if status not in (200, 201, 202):
            raise Failed(status, body)
        created: dict[str, Any] = json.loads(body)
        return created

    def create_in(self, namespace: str | None, obj: Mapping[str, Any]) -> dict[str, Any]:
        """`kubectl create [-n NAMESPACE] -f -` of `obj` (its own namespace, if it names one,
        wins; else the kubeconfig's): POSTed to its kind's collection at its apiVersion.
        Raises Failed with the API server's refusal, Unsupported where discovery does not
        know its kind."""
        kind = str(obj.get("kind") or "")
        group, _, version = str(obj.get("apiVersion") or "").rpartition("/")
        known = self._resource(f"{kind.lower()}.{group}" if group else kind.lower())
        resource = Resource(group, version, known.plural, kind, known.namespaced)
        own = (obj.get("metadata") or {}).get("namespace")
        where = str(own or namespace or self._creds().namespace)
        return self.create(resource.path(where), obj)

    def delete(self, path: str) -> bool:
        """DELETE the object at `path` in the background (`kubectl delete --wait=false`):
        True when the API server took it, False when it was already gone."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions",
                   "propagationPolicy": "Background"}
        status, body, _ = self._send(path, "application/json", "DELETE",
                                     json.dumps(options).encode())
        if status == 404:
            return False
        if status not in (200, 202):
            raise Failed(status, body)
        return True

    def _send(self, path: str, accept: str, method: str = "GET",
             payload: bytes | None = None) -> tuple[int, bytes, int | None]:
        """The status, body and Retry-After seconds (None: not to be retried) of a request,
        a GET unless `method` says otherwise. A request whose connection broke is sent once
        more on a new one: a kept-alive connection the server closed since."""
        creds = self._creds()
        headers = {"Accept": accept, "User-Agent": "modelpool-e2e-reads"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if creds.token:
            headers["Authorization"] = f"Bearer {creds.token}"
        for attempt in (0, 1):
            connection = self._connection(creds)
            try:
                connection.request(method, path, body=payload, headers=headers)
                response = connection.getresponse()
                body = response.read()
                break
            except (http.client.HTTPException, OSError) as e:
                connection.close()
                self._local.connection = None
                with self._lock:
                    self._connections.remove(connection)
                if attempt == 1:
                    raise Failed(0, json.dumps({"reason": "ConnectionFailed",
                                                "message": f"{creds.server}: {e}"}).encode()) \
                        from e
        return response.status, body, retry_after(response.status,
                                                  response.getheader("Retry-After"))


MAX_RETRIES = 10


def retry_after(status: int, header: str | None) -> int | None:
    """Seconds to wait before asking again, as client-go reads an answer: a 429 or 5xx
    with a whole number of seconds in Retry-After (at least 1); None otherwise."""
    if not (status == 429 or 500 <= status < 600) or header is None:
        return None
    try:
        seconds = int(header.strip())
    except ValueError:
        return None
    return max(seconds, 1)
