"""`modelpool-kv-files`: a container beside a persisted llama.cpp member's server in its
pod, with the member's claim mounted. llama-server writes and reads slot files but has no
action that removes one, and the reconciler mounts no claim: this is how a file that no
manifest names any more leaves the claim while the member runs.

`POST /prune` with `{"keep": ["<member>-<uid8>", ...]}` removes every slot file on the
claim whose owner is not kept (`kv_cache.unkept_files`; other files are never touched)
and answers `{"removed": [...], "failed": [{"file", "error"}]}`; a body of another shape
is a 400 that says what is wrong. `GET /healthz` is 200. Only the reconciler's pods may
reach its port (the member's NetworkPolicy). It listens on MODELPOOL_BIND_HOST (default
every address) and stops on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from aiohttp import web

from reconciler.kv_cache import unkept_files
from telemetry.logs import configure_logging

log = logging.getLogger("modelpool.kv_files")
DIRECTORY = web.AppKey("directory", str)


def _files(directory: str) -> list[str]:
    with os.scandir(directory) as entries:
        return [e.name for e in entries if e.is_file(follow_symlinks=False)]


def _remove(directory: str, names: Sequence[str]) -> tuple[list[str], list[dict[str, str]]]:
    removed: list[str] = []
    failed: list[dict[str, str]] = []
    for name in names:
        try:
            os.remove(os.path.join(directory, name))
        except FileNotFoundError:
            continue  # gone already
        except OSError as e:
            failed.append({"file": name, "error": e.strerror or str(e)})
            log.warning("slot file not removed: %s", e, extra={"file": name})
            continue
        removed.append(name)
        log.info("slot file removed", extra={"file": name})
    return removed, failed


def _bad(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


async def prune(request: web.Request) -> web.Response:
    try:
        body = json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _bad("the body is not JSON: expected {\"keep\": [\"<member>-<uid8>\", ...]}")
    keep = body.get("keep") if isinstance(body, dict) else None
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        return _bad("keep: expected a list of owners, each \"<member>-<uid8>\"")
    directory = request.app[DIRECTORY]
    try:
        names = await asyncio.to_thread(_files, directory)
    except OSError as e:
        return web.json_response({"error": f"{directory}: {e.strerror or e}"}, status=500)
    removed, failed = await asyncio.to_thread(_remove, directory,
                                              unkept_files(names, frozenset(keep)))
    return web.json_response({"removed": removed, "failed": failed})


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def make_app(directory: str) -> web.Application:
    app = web.Application(client_max_size=1 << 20)
    app[DIRECTORY] = directory
    app.router.add_post("/prune", prune)
    app.router.add_get("/healthz", healthz)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelpool-kv-files", description=__doc__)
    parser.add_argument("--dir", required=True, help="the claim's directory")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    configure_logging("INFO")
    host = os.environ.get("MODELPOOL_BIND_HOST") or "0.0.0.0"
    web.run_app(make_app(args.dir), host=host, port=args.port, print=None,
                shutdown_timeout=5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
