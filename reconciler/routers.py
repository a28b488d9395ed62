"""The ModelRouter reconciler: render a router's Deployment, ServiceAccount, Role,
RoleBinding, Service and ConfigMap from its backends and the servers and pools they
name, apply them, prune what it no longer renders, and write its status."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from reconciler.context import Context
from reconciler.objects import meta
from reconciler.render import LABEL_ROUTER, ROUTER_KINDS, RenderError, router_object_name
from reconciler.router_config import MissingServer
from reconciler.router_status import router_status
from reconciler.spec import ModelPoolSpec, ModelRouterSpec, ModelServerSpec, SpecError
from reconciler.stores import ROUTER, Key, Result

log = logging.getLogger(__name__)


class RouterReconciler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def reconcile(self, key: Key) -> Result:
        ctx, writer = self.ctx, self.ctx.writer
        namespace, name = key.namespace, key.name
        body = ctx.stores.routers.get(namespace, name)
        if body is None:
            ctx.settling.forget(Key(ROUTER, namespace, name))
            writer.forget_creation(namespace, router_object_name(name))
            return Result()
        m = meta(body)
        if m.get("deletionTimestamp"):
            # Being deleted (a finalizer holds it): what it rendered goes with it, and the
            # servers it refers to may be gone first (its namespace is being deleted, or
            # git removed them together), which is no reason to call it Stalled.
            log.info("ModelRouter %s/%s is being deleted: what it rendered goes with it",
                     namespace, name)
            return Result()
        logger = writer.logger(body, log)
        try:
            spec = ModelRouterSpec.from_body(body)
            # Only what the router's config reads: the servers its backends name and the
            # pools that hold them (a router's reconcile costs the same however many other
            # servers and pools share its namespace).
            servers = {}
            pool_names: set[str] = set()
            for ref in spec.model_server_refs:
                obj = ctx.stores.servers.get(namespace, ref)
                if obj is not None:
                    with contextlib.suppress(SpecError):
                        servers[ref] = ModelServerSpec.from_body(obj)
                pool_names.update(ctx.lookups.pools_of(namespace, ref))
            pools = []
            for pool_name in sorted(pool_names):
                obj = ctx.stores.pools.get(namespace, pool_name)
                if obj is not None:
                    with contextlib.suppress(SpecError):
                        pools.append(ModelPoolSpec.from_body(obj))
            objects = ctx.renderer.router(spec, servers=servers, pools=pools,
                                          owner_uid=m.get("uid"))
        except MissingServer as e:
            remaining = ctx.settling.remaining(ROUTER, body)
            if remaining is not None:
                await writer.write_waiting(body, str(e))
                return Result(remaining)
            await writer.write_stalled(body, logger, "CannotRender", str(e))
            return Result()
        except (SpecError, RenderError) as e:
            reason = "InvalidSpec" if isinstance(e, SpecError) else "CannotRender"
            await writer.write_stalled(body, logger, reason, str(e))
            return Result()
        await writer.apply_for(body, logger, objects)
        await writer.prune(ROUTER_KINDS, namespace, (LABEL_ROUTER, name), m.get("uid"),
                           {(str(o["kind"]), str(o["metadata"]["name"])) for o in objects})
        deployment = ctx.stores.deployments.get(namespace, router_object_name(name)) or {}
        backend_pools: dict[str, str | None] = {}
        backend_servers: dict[str, dict[str, Any]] = {}
        for server_name in spec.model_server_refs:
            pools_of = ctx.lookups.pools_of(namespace, server_name)
            backend_pools[server_name] = pools_of[0] if len(pools_of) == 1 else None
            found = ctx.stores.servers.get(namespace, server_name)
            if found is not None:
                backend_servers[server_name] = found.get("status") or {}
        status = router_status(spec, namespace, deployment, backend_pools, backend_servers,
                               body.get("status"), ctx.clock())
        await writer.write_status(ctx.stores.routers, body, status.owned)
        return Result(await writer.retry_creation(
            namespace, router_object_name(name), status.not_created, logger))
