"""A pool's prewarm (spec.prewarm): while a swap drains and unloads its incumbent, a pod on
the incumbent's node reads the target's weights into the page cache, so the target's load
reads them from memory."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from reconciler import kube as k
from reconciler import swap as s
from reconciler.context import Context
from reconciler.logs import ObjectLogger
from reconciler.objects import meta
from reconciler.render import prewarm_pod_name
from reconciler.spec import ModelServerSpec, SpecError


class Prewarm:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # The swap target each pool's prewarm pod reads for, and whether one was created.
        self._prewarming: dict[tuple[str, str], tuple[str, bool]] = {}

    def forget(self, namespace: str, pool: str) -> None:
        """The pool is gone (the garbage collector takes its pod)."""
        self._prewarming.pop((namespace, pool), None)

    async def sync(self, namespace: str, pool: str, body: Mapping[str, Any],
                   state: s.PoolState | None, logger: ObjectLogger) -> None:
        """Run the prewarm pod `state` wants (`state` None when spec.prewarm is off). It is
        created in the step that starts the drain and deleted once the swap ends: not as
        the target loads, when a read still under way goes on feeding the load, and the
        kubelet's work is the target's start."""
        ctx = self.ctx
        key = (namespace, pool)
        swap = s.visible_swap(state) if state is not None else None
        want = None
        if swap is not None and swap.from_ is not None:
            want = swap.to
        have = self._prewarming.get(key)
        if have is not None and have[0] != want:
            del self._prewarming[key]
            if have[1]:
                try:
                    await ctx.writer.delete_pod(namespace, prewarm_pod_name(pool))
                except k.KubeError as e:  # its activeDeadlineSeconds ends it anyway
                    logger.warning("prewarm pod not deleted: %s", e)
        if want is None or (have is not None and have[0] == want):
            return
        assert state is not None and swap is not None and swap.from_ is not None
        swap_budget = state.config.swap_budget
        nodes = sorted({str((p.get("spec") or {}).get("nodeName"))
                        for p in ctx.lookups.active_pods_of(namespace, swap.from_)
                        if (p.get("spec") or {}).get("nodeName")})
        if not nodes:
            return  # the incumbent is gone already: the load is about to start
        try:
            target = ModelServerSpec.from_body(ctx.stores.servers.get(namespace, want) or {})
        except SpecError:
            return  # the swap itself reports a target it cannot use
        pod = ctx.renderer.prewarm_pod(target, pool=pool, pool_uid=meta(body).get("uid"),
                                       node=nodes[0], deadline=swap_budget)
        # Recorded before the apply: a refused one still has the name deleted once the
        # swap ends, so a pod left from an earlier swap, whose spec a pod cannot change
        # (422), is out of the way of the next swap's reader.
        self._prewarming[key] = (want, pod is not None)
        if pod is None:
            return
        try:
            await ctx.writer.apply_pod(pod)
        except k.KubeError as e:
            # best effort: the swap goes on without it (admission may refuse the pod)
            logger.warning("prewarm pod for %s not created: %s", want, e)
            return
        logger.info("prewarming %s on %s while %s unloads", want, nodes[0], swap.from_)
        ctx.background.run(functools.partial(
            logger.event, "Normal", "Prewarming",
            f"reading {want}'s weights into the page cache of {nodes[0]} while "
            f"{swap.from_} drains and unloads"), "event-Prewarming")
