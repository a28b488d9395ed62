"""A git server over smart HTTP for the Flux testbed: `git http-backend` behind a threaded
HTTP server of Python's standard library.

It serves the bare repositories under `--root` at `/<name>.git` for fetching (what Flux's
source-controller does) and pushing (what `e2e/flux/up.sh` and the tests do: receive-pack
is on, with no authentication, so keep it inside a test cluster). `--repo NAME` creates an
empty repository whose default branch is `main` at start. `GET /healthz` answers 200.

    python3 -m e2e.flux.git_server --root /srv/git --repo modelpool --port 8080

Request bodies may be chunked (git sends large pushes so); the backend's CGI response is
relayed with its status and headers. One JSON line is logged per request.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

BACKEND_TIMEOUT = 120.0


def log(event: str, **fields: object) -> None:
    record = {"ts": round(time.time(), 3), "event": event, **fields}
    print(json.dumps(record), file=sys.stderr, flush=True)


def create_repository(root: Path, name: str) -> Path:
    """An empty bare repository `root/name.git` (default branch main) that accepts pushes."""
    path = root / f"{name}.git"
    if not (path / "HEAD").exists():
        subprocess.run(
            ["git", "init", "--quiet", "--bare", "--initial-branch=main", str(path)],
            check=True,
        )
    subprocess.run(["git", "-C", str(path), "config", "http.receivepack", "true"], check=True)
    return path


def parse_cgi_response(output: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """A CGI program's output split into status, headers and body."""
    for separator in (b"\r\n\r\n", b"\n\n"):
        head, found, body = output.partition(separator)
        if found:
            break
    else:
        raise ValueError("the backend wrote no header block")
    status = 200
    headers: list[tuple[str, str]] = []
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers.append((name.strip(), value.strip()))
    return status, headers, body


class GitHandler(BaseHTTPRequestHandler):
    server_version = "modelpool-git-server"
    root: Path = Path("/srv/git")

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/healthz":
            self._reply(200, [("Content-Type", "text/plain")], b"ok\n")
            return
        self._backend(b"")

    def do_POST(self) -> None:
        self._backend(self._body())

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _backend(self, body: bytes) -> None:
        started = time.monotonic()
        url = urlsplit(self.path)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "REMOTE_ADDR": self.client_address[0],
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
        }
        for header in ("Content-Encoding", "Git-Protocol"):
            value = self.headers.get(header)
            if value:
                env["HTTP_" + header.upper().replace("-", "_")] = value
        try:
            done = subprocess.run(
                ["git", "http-backend"], input=body, env=env, capture_output=True,
                timeout=BACKEND_TIMEOUT, check=False,
            )
            status, headers, payload = parse_cgi_response(done.stdout)
        except (subprocess.TimeoutExpired, ValueError) as error:
            log("backend_failed", path=url.path, error=str(error))
            self._reply(500, [("Content-Type", "text/plain")], f"{error}\n".encode())
            return
        if done.stderr:
            log("backend_stderr", path=url.path, stderr=done.stderr.decode(errors="replace"))
        self._reply(status, headers, payload)
        log(
            "request", method=self.command, path=url.path, query=url.query, status=status,
            request_bytes=len(body), response_bytes=len(payload),
            ms=round(1000 * (time.monotonic() - started), 1),
        )

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Requests are logged as JSON by `_backend`."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/srv/git"))
    parser.add_argument("--repo", action="append", default=[], help="create this repository")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    for name in args.repo:
        log("repository", path=str(create_repository(args.root, name)))
    GitHandler.root = args.root
    server = ThreadingHTTPServer((args.host, args.port), GitHandler)
    server.daemon_threads = True
    log("listening", host=args.host, port=args.port, root=str(args.root))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
