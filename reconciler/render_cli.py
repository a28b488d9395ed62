"""`python -m reconciler render FILES...`: print what the reconciler would apply.

GitOps users commit and review rendered output; this goes through the same Renderer, with
the replica counts of a cold start (a pool's default member at 1, its other members at 0,
a standalone ModelServer at spec.replicas). Objects of other kinds in the files are skipped.
Owner references are only printed for objects whose metadata carries a uid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from reconciler.device_claim import claim_name
from reconciler.footprints import footprints
from reconciler.render import Renderer, RenderError
from reconciler.router_config import pool_of
from reconciler.spec import (
    API_VERSION,
    DEFAULT_ROUTER_IMAGE,
    ModelPoolSpec,
    ModelRouterSpec,
    ModelServerSpec,
    SpecError,
)

_KINDS = ("ModelServer", "ModelPool", "ModelRouter")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the router's config.json) as literal blocks, for review, and
    never an anchor or alias: the output is for people and for kubectl."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _files(paths: Iterable[str]) -> list[str]:
    """The paths given, a directory standing for its *.yaml and *.yml files."""
    files: list[str] = []
    for path in paths:
        p = Path(path)
        if path != "-" and p.is_dir():
            files += sorted(str(f) for f in p.iterdir() if f.suffix in (".yaml", ".yml"))
        else:
            files.append(path)
    return files


def _load(paths: Iterable[str], stdin: TextIO) -> list[tuple[str, dict[str, Any]]]:
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in _files(paths):
        text = stdin.read() if path == "-" else Path(path).read_text()
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict):
                docs.append((path, doc))
    return docs


def cold_start_replicas(ms: ModelServerSpec, pool: ModelPoolSpec | None) -> int:
    """A pool's default member starts at 1 and its other members at 0; a standalone
    server runs spec.replicas."""
    if pool is None:
        return ms.replicas
    return 1 if pool.default == ms.name else 0


def render_documents(
    docs: Sequence[tuple[str, dict[str, Any]]],
    renderer: Renderer,
    default_namespace: str = "default",
) -> list[dict[str, Any]]:
    """Everything the reconciler would apply for `docs` ((source, body) pairs) on a cold
    start: claim pools' ResourceClaims, servers (sorted by namespace and name), then
    routers."""
    servers: dict[tuple[str, str], tuple[ModelServerSpec, str | None]] = {}
    pools: list[ModelPoolSpec] = []
    routers: list[tuple[ModelRouterSpec, str | None]] = []
    for source, body in docs:
        kind = body.get("kind")
        if body.get("apiVersion") != API_VERSION or kind not in _KINDS:
            continue
        meta = body.setdefault("metadata", {})
        if isinstance(meta, dict):
            meta.setdefault("namespace", default_namespace)
        try:
            if kind == "ModelServer":
                ms = ModelServerSpec.from_body(body)
                servers[(ms.namespace, ms.name)] = (ms, ms.uid)
            elif kind == "ModelPool":
                pools.append(ModelPoolSpec.from_body(body))
            else:
                router = ModelRouterSpec.from_body(body)
                routers.append((router, router.uid))
        except SpecError as e:
            name = meta.get("name") if isinstance(meta, dict) else None
            raise SpecError(f"{source}: {kind} {name}: {e}") from e
    # a claim pool's ResourceClaim first: its members' pods reference it
    out: list[dict[str, Any]] = [
        renderer.pool_claim(p, owner_uid=p.uid)
        for p in sorted(pools, key=lambda p: (p.namespace, p.name)) if p.claim is not None]
    for (namespace, name), (ms, uid) in sorted(servers.items()):
        pool = pool_of(name, [p for p in pools if p.namespace == namespace])
        budgeted = pool is not None and pool.budgeted
        out += renderer.model_server(
            ms,
            replicas=cold_start_replicas(ms, pool),
            owner_uid=uid,
            pool=pool.name if pool else None,
            routers=[r.name for r, _ in routers
                     if r.namespace == namespace and name in r.model_server_refs],
            # a budgeted pool's member as before its claim is allocated: the device's
            # memory is what the spec states
            gpu_footprint=footprints(pool, {name: ms})[name] if pool and budgeted else None,
            device_claim=claim_name(pool.name) if pool and pool.claim else None,
            device_memory=pool.gpu_memory if pool and budgeted else None,
        )
    for router, uid in sorted(routers, key=lambda r: (r[0].namespace, r[0].name)):
        out += renderer.router(
            router,
            servers={n: s for (ns, n), (s, _) in servers.items() if ns == router.namespace},
            pools=[p for p in pools if p.namespace == router.namespace],
            owner_uid=uid,
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["render"]:
        args = args[1:]
    parser = argparse.ArgumentParser(
        prog="python -m reconciler render",
        description="Print the objects the reconciler would apply for the given "
        "ModelServer, ModelPool and ModelRouter files (multi-document YAML; a directory "
        "stands for its *.yaml files; - is stdin).",
    )
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument(
        "-n", "--namespace", default="default",
        help="namespace of objects that name none (default: default)",
    )
    parser.add_argument("--templates", type=Path, default=None, help="templates directory")
    parser.add_argument(
        "--router-image", default=DEFAULT_ROUTER_IMAGE,
        help=f"image of the routers whose spec.proxy.image is unset (default: "
        f"{DEFAULT_ROUTER_IMAGE})",
    )
    opts = parser.parse_args(args)
    try:
        docs = _load(opts.files, sys.stdin)
        renderer = Renderer(opts.templates, router_image=opts.router_image)
        objects = render_documents(docs, renderer, opts.namespace)
    except (OSError, yaml.YAMLError, SpecError, RenderError) as e:
        print(f"render: {e}", file=sys.stderr)
        return 1
    yaml.dump_all(objects, sys.stdout, Dumper=_Dumper, sort_keys=False)
    return 0
