"""The activator's async shell: it feeds the pure state machine and carries out its actions.

`sidecar.activator` decides; this module owns everything that waits or talks: the held
requests' futures, the watches of the router's ModelPools and of the member Services'
EndpointSlices (through a `KubePort`, implemented by `sidecar.kube`), the compare-and-swap
writes and re-reads, the timer that wakes the machine at its next deadline, the metrics,
and the Events on the pools (`sidecar.events` decides which, `sidecar.event_reporter`
posts them in the background). The proxy only sees `Activation.acquire`: a context
manager that yields where to send a request once its member is resident, and spans the
request while it runs.

It also keeps, per pool, at most one early readiness prober of a swap's target
(`sidecar.early_probes`, by default through `sidecar.http.probes.probe_ready`): the first
200 becomes the machine's `EarlyReady`, and held requests go out on that address without
waiting for the kubelet's next readiness probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from sidecar import activator, events
from sidecar.activator import (
    Action,
    Admit,
    Arrive,
    EarlyLost,
    EarlyReady,
    EndpointsObserved,
    Event,
    Fail,
    Leave,
    PoolLimits,
    PoolObserved,
    PoolState,
    PoolStatus,
    Reconfigure,
    Reread,
    Shutdown,
    Tick,
    WriteConflicted,
    WriteFailed,
    WriteRequest,
    WriteSucceeded,
)
from sidecar.config import BackendConfig, PoolConfig, RouterConfig
from sidecar.early_probes import EarlyProbes, ReadinessProbe, Wanted
from sidecar.endpoints import EndpointIndex
from sidecar.event_reporter import EventPort, EventReporter
from sidecar.events import Refusal
from sidecar.http.probes import probe_ready
from sidecar.kube_port import (
    Changed,
    Conflict,
    Deleted,
    KubeError,
    KubePort,
    Listed,
    WatchEvent,
)
from sidecar.metrics import RouterMetrics
from sidecar.pool_watches import PoolWatches
from sidecar.target import ActivationError, Target

logger = logging.getLogger(__name__)

NO_READY_ENDPOINT = "no_ready_endpoint"
_REREAD_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)
# A router fronting at most this many Services watches their EndpointSlices alone (a label
# selector naming them); one fronting more watches every Service's in its namespace.
MAX_SELECTED_SERVICES = 100


# --- Public interface for the proxy -------------------------------------------------------


class _Lease:
    """One request's hold on a backend (`Activation.acquire`): entered once it may be
    served, left when its answer is done. A plain class rather than an
    `asynccontextmanager`: every proxied request takes one, and an async generator costs
    a registration with the event loop besides its frames."""

    __slots__ = ("_activation", "_backend")

    def __init__(self, activation: Activation, backend: BackendConfig) -> None:
        self._activation = activation
        self._backend = backend

    async def __aenter__(self) -> Target:
        return await self._activation._enter(self._backend)

    async def __aexit__(self, *exc: object) -> None:
        self._activation._leave(self._backend)


def limits_for(pool: PoolConfig, config: RouterConfig) -> PoolLimits:
    fair = pool.swap_policy == "fair"
    return PoolLimits(
        members=pool.members,
        swap_budget=pool.swap_budget_seconds,
        max_held=config.max_held_requests,
        max_wait=pool.max_wait_seconds if fair else None,
    )


class Activation:
    """Per-pool activators of one router, and the endpoints its backends dispatch to."""

    def __init__(
        self,
        config: RouterConfig,
        kube: KubePort | None,
        metrics: RouterMetrics,
        *,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
        events_port: EventPort | None = None,
        probe: ReadinessProbe | None = probe_ready,
    ) -> None:
        """`identity` is `namespace/router/pod`. Events go to `events_port`, by default the
        kube client when it can post them; with neither, no Events. `probe` checks a
        swap's target early (None: wait for its endpoint to turn ready)."""
        self._config = config
        self._kube = kube
        port = events_port
        if port is None and isinstance(kube, EventPort):
            port = kube
        self._events = (
            None if port is None else EventReporter(port, identity.rsplit("/", 1)[-1], clock=clock)
        )
        self._metrics = metrics
        self._identity = identity
        self._clock = clock
        self._pools: dict[str, PoolState] = {
            p.name: activator.initial_state(p.name, identity, limits_for(p, config))
            for p in config.pools
        }
        self._seen: dict[str, PoolStatus] = {}  # latest status of every pool watched
        self._endpoints = EndpointIndex()
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)
        self._inflight: Counter[str] = Counter()  # per backend
        # Per backend with a URL: that URL and its one target.
        self._static: dict[str, tuple[str, Target]] = {}
        self._pools_synced = False  # every pool watch listed once
        self._pool_watches = (
            None if kube is None else PoolWatches(kube, config.namespace, self._pool_event))
        self._slices_synced = False
        self._wake = asyncio.Event()
        self._work: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._closed = False
        self._early = EarlyProbes(probe, self._answered_early)
        self._tasks: asyncio.TaskGroup | None = None  # while `run` runs
        # The EndpointSlice watch and the Services it asked for (see `_slice_services`).
        self._slice_task: asyncio.Task[None] | None = None
        self._watched_services: frozenset[str] | None = None

    # --- lifecycle ---

    async def run(self) -> None:
        """Watch pools and EndpointSlices, wake the machines at their deadlines, and carry
        out writes and re-reads. Runs until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tasks = tg
                tg.create_task(self._ticker())
                tg.create_task(self._worker(tg))
                if self._events is not None:
                    tg.create_task(self._events.run())
                if self._kube is not None:
                    self._sync_pool_watches()
                    self._start_slice_watch()
        finally:
            self._tasks = None
            self._slice_task = None
            if self._pool_watches is not None:
                self._pool_watches.clear()  # the task group cancelled them
            self._early.clear()  # the task group cancelled them

    def ready(self) -> bool:
        return self._kube is None or (self._pools_synced and self._slices_synced)

    async def shutdown(self, retry_after: float) -> None:
        """Answer every held request, and every later one, with `shutting_down`."""
        self._closed = True
        for name in list(self._pools):
            self._feed(name, Shutdown(retry_after))

    def update_config(self, config: RouterConfig) -> None:
        if config.namespace != self._config.namespace:
            logger.warning(
                "router namespace changed from %s to %s: restart the router to watch it",
                self._config.namespace,
                config.namespace,
            )
        self._config = config
        if self._slice_services() != self._watched_services:
            self._start_slice_watch()  # other backends' Services: watch theirs instead
        self._sync_pool_watches()  # a pool added or gone: watch it, or stop
        for p in config.pools:
            limits = limits_for(p, config)
            if p.name in self._pools:
                self._feed(p.name, Reconfigure(limits))
            else:
                self._pools[p.name] = activator.initial_state(p.name, self._identity, limits)
                self._feed(p.name, PoolObserved(self._seen.get(p.name)))
        self._refresh_ready()

    # --- requests ---

    def acquire(self, backend: BackendConfig) -> AbstractAsyncContextManager[Target]:
        return _Lease(self, backend)

    async def _enter(self, backend: BackendConfig) -> Target:
        """A target for `backend`, once it may serve (held while its pool swaps); counted
        in flight until `_leave`."""
        if backend.url is not None:
            known = self._static.get(backend.name)
            if known is None or known[0] != backend.url:
                known = self._static[backend.name] = (
                    backend.url, Target(backend.url.rstrip("/"), backend.name, None))
            return known[1]
        pooled = backend.pool is not None and backend.model_server is not None
        if pooled:
            assert backend.pool is not None and backend.model_server is not None
            await self._hold(backend.pool, backend.model_server)
        elif self._closed:
            raise ActivationError("the router is shutting down", code=activator.SHUTTING_DOWN)
        target = self._pick(backend)
        if target is None:
            raise ActivationError(
                f"{backend.name} has no ready endpoint", code=NO_READY_ENDPOINT, retry_after=1.0
            )
        self._inflight[backend.name] += 1
        return target

    def _leave(self, backend: BackendConfig) -> None:
        if backend.url is None:
            self._inflight[backend.name] -= 1

    async def _hold(self, pool: str, member: str) -> None:
        if pool not in self._pools:
            raise ActivationError(
                f"pool {pool} is not in the router config", code=NO_READY_ENDPOINT
            )
        wid = next(self._ids)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[wid] = future
        try:
            elsewhere = sum(activator.held_total(s) for n, s in self._pools.items() if n != pool)
            self._feed(pool, Arrive(wid, member, elsewhere))
            await future
        except asyncio.CancelledError:
            # The client went away. The load it asked for goes on; the machine decides
            # whether the request for it is withdrawn.
            self._feed(pool, Leave(wid, member))
            raise
        finally:
            del self._waiting[wid]

    def report_connect_failure(self, target: Target) -> None:
        """The upstream refused the connection: mark the address bad, and re-read the pool
        and the Service's EndpointSlices at once, so stale residency is not served."""
        backend = self._config.backend(target.backend)
        if backend is None or backend.service is None:
            return
        address = target.base_url.removeprefix("http://")
        logger.warning("connection to %s (%s) failed: marking it bad", address, backend.name)
        self._endpoints.mark_bad(backend.service, address, self._clock())
        self._refresh_ready()
        if self._kube is None:
            return
        kube, service = self._kube, backend.service
        self._submit(lambda: self._relist_service(kube, service))
        if backend.pool is not None and backend.pool in self._pools:
            pool = backend.pool
            self._submit(lambda: self._reread(kube, pool))

    def model_states(self) -> dict[str, str]:
        now = self._clock()
        states: dict[str, str] = {}
        for b in self._config.backends:
            if b.url is not None:
                states[b.name] = "ready"
            elif b.pool is not None and b.model_server is not None and b.pool in self._pools:
                states[b.name] = activator.member_state(self._pools[b.pool], b.model_server)
            elif b.service is not None and self._endpoints.ready_addresses(b.service, now, b.port):
                states[b.name] = "ready"
            else:
                states[b.name] = "unavailable"
        return states

    def serves_now(self, backend: BackendConfig) -> bool:
        """Whether a request for `backend` would be dispatched without a hold."""
        if backend.pool is None or backend.model_server is None:
            return True
        state = self._pools.get(backend.pool)
        return (state is not None
                and activator.member_state(state, backend.model_server) == "resident"
                and self._pick(backend) is not None)

    def swap_can_start(self, backend: BackendConfig) -> bool:
        """Whether a swap to `backend`'s member could start at once (activation IfIdle): no
        swap runs or waits in this pool, and its resident member has no request in flight
        through this router. In a pool with a memory budget: the member fits in the room
        left, or nothing waits and the residents idle through this router (none a victim
        of a load already) free enough room for it. The reconciler's idle probe still
        decides the drain; this is what one router can know."""
        if backend.pool is None:
            return True
        state = self._pools.get(backend.pool)
        status = self._seen.get(backend.pool)
        if state is None or status is None:
            return False
        if status.residents is not None:
            return self._load_can_start(backend, state, status)
        if status.swap is not None:
            return False
        if activator.held_total(state):
            return False
        if status.resident_member is None:
            return True
        incumbent = self._config.backend_for_member(status.resident_member)
        return incumbent is None or self._inflight[incumbent.name] == 0

    def _load_can_start(self, backend: BackendConfig, state: activator.PoolState,
                        status: activator.PoolStatus) -> bool:
        """A budgeted pool's IfIdle: `backend`'s member fits now, or idle residents make
        room for it at once."""
        member = backend.model_server
        need = status.footprints.get(member or "")
        if member is None or need is None or status.room_left is None:
            return False
        if need <= status.room_left or member in {x.to_member for x in status.loads}:
            return True  # it loads at once, or its load already runs
        if activator.held_total(state):
            return False
        evicting = {v for load in status.loads for v in load.victims}
        idle = 0
        for resident in status.residents or ():
            incumbent = self._config.backend_for_member(resident)
            if resident in evicting or (incumbent is not None
                                        and self._inflight[incumbent.name] > 0):
                continue
            idle += status.footprints.get(resident, 0)
        return status.room_left + idle >= need

    def hold_progress(self, backend: BackendConfig) -> str:
        """What a request held for `backend` waits on, as the pool's status says: the
        swap's phase, or the member's state when no swap runs yet."""
        pool = self._seen.get(backend.pool or "")
        if pool is not None and pool.swap is not None:
            stuck = f": {pool.swap.stuck_on}" if pool.swap.stuck_on else ""
            return f"swap phase {pool.swap.phase}{stuck}"
        return f"member {self.model_states().get(backend.name, 'unavailable')}"

    def inflight(self) -> int:
        """Requests between acquire and the end of their response."""
        return sum(self._inflight.values())

    # --- the machine ---

    def _feed(self, pool: str, event: Event) -> None:
        state, actions = activator.step(self._pools[pool], event, self._clock())
        self._pools[pool] = state
        for action in actions:
            self._execute(pool, action)
        for member, count in activator.held_counts(state).items():
            self._metrics.held(pool, member).set(count)
        if self._events is not None:
            refused = [
                Refusal(a.member, a.code, a.status)
                for a in actions
                if isinstance(a, Fail) and a.code in events.REPORTED_CODES
            ]
            if refused:
                self._note_refusals(pool, state, refused)
        self._wake.set()
        self._sync_prober(pool)

    def _note_refusals(self, pool: str, state: PoolState, refused: list[Refusal]) -> None:
        assert self._events is not None
        notes = events.refusals(
            self._config.namespace,
            self._config.name,
            pool,
            refused,
            swap_budget=state.limits.swap_budget,
            max_held=state.limits.max_held,
        )
        for note in notes:
            self._events.note(note)

    def _execute(self, pool: str, action: Action) -> None:
        match action:
            case Admit(waiter=wid, member=member, held_for=held_for):
                if held_for is None:
                    self._metrics.coalesced(pool, member)
                else:
                    self._metrics.observe_hold(pool, member, held_for)
                self._resolve(wid, None)
            case Fail() as fail:
                if fail.held_for is not None:
                    self._metrics.observe_hold(pool, fail.member, fail.held_for)
                logger.info(
                    "pool %s: request for %s refused: %s",
                    self._ref(pool),
                    fail.member,
                    fail.message,
                )
                self._resolve(
                    fail.waiter,
                    ActivationError(fail.message, code=fail.code, status=fail.status,
                                    retry_after=fail.retry_after),
                )
            case WriteRequest() as write:
                if self._kube is not None:
                    kube = self._kube
                    self._submit(lambda: self._write(kube, pool, write))
            case Reread():
                if self._kube is not None:
                    kube = self._kube
                    self._submit(lambda: self._reread(kube, pool))

    def _resolve(self, wid: int, error: ActivationError | None) -> None:
        future = self._waiting.get(wid)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def _submit(self, work: Callable[[], Awaitable[None]]) -> None:
        self._work.put_nowait(work)

    async def _worker(self, tg: asyncio.TaskGroup) -> None:
        while True:
            work = await self._work.get()
            tg.create_task(_logged(work()))

    async def _ticker(self) -> None:
        while True:
            now = self._clock()
            times = [activator.next_wakeup(s, now) for s in self._pools.values()]
            times.append(self._endpoints.next_expiry(now))
            wake = min((t for t in times if t is not None), default=None)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if wake is None else max(0.0, wake - now)):
                    await self._wake.wait()
            if wake is not None and self._clock() >= wake:
                self._refresh_ready()
                for name in list(self._pools):
                    self._feed(name, Tick())

    # --- API server work ---

    def _ref(self, pool: str) -> str:
        """`namespace/name` of a pool, as every log line names it."""
        return f"{self._config.namespace}/{pool}"

    async def _write(self, kube: KubePort, pool: str, write: WriteRequest) -> None:
        namespace = self._config.namespace
        try:
            status = await kube.write_request(namespace, pool, write)
        except Conflict:
            logger.info(
                "pool %s: request %s lost its race; re-reading", self._ref(pool), write.request
            )
            self._feed(pool, WriteConflicted())
            return
        except KubeError as e:
            logger.warning(
                "pool %s: writing request %s failed: %s", self._ref(pool), write.request, e
            )
            self._feed(pool, WriteFailed())
            return
        except Exception:
            # The machine must hear back about every write, or it never writes again.
            logger.exception("pool %s: writing request %s failed", self._ref(pool), write.request)
            self._feed(pool, WriteFailed())
            return
        logger.info(
            "pool %s: requested %s (generation %s)",
            self._ref(pool),
            write.request.member or "nothing (withdrawn)",
            write.request.generation,
        )
        self._seen[pool] = status
        member = write.request.member
        if self._events is not None and member is not None:
            held = activator.held_counts(self._pools[pool]).get(member, 0)
            self._events.note(
                events.swap_requested(
                    self._config.namespace,
                    self._config.name,
                    pool,
                    member,
                    status.resident_member,
                    held,
                )
            )
        self._feed(pool, WriteSucceeded(status))

    async def _reread(self, kube: KubePort, pool: str) -> None:
        # The machine decides nothing for this pool until it hears back: keep trying.
        for attempt in itertools.count():
            try:
                status = await kube.get_pool(self._config.namespace, pool)
            except KubeError as e:
                delay = _REREAD_BACKOFF[min(attempt, len(_REREAD_BACKOFF) - 1)]
                logger.warning(
                    "pool %s: re-read failed (%s); again in %ss", self._ref(pool), e, delay
                )
                await asyncio.sleep(delay)
                continue
            if status is not None:
                self._seen[pool] = status
            self._feed(pool, PoolObserved(status))
            return

    async def _relist_service(self, kube: KubePort, service: str) -> None:
        slices = await kube.list_endpoint_slices(self._config.namespace, service)
        self._endpoints.replace_service(service, slices)
        self._refresh_ready()

    def _sync_pool_watches(self) -> None:
        """Watch the configured pools (each by name), while `run` runs."""
        if self._pool_watches is None or self._tasks is None:
            return
        for stopped in self._pool_watches.sync(self._tasks, [p.name for p in self._config.pools]):
            if stopped is not None:
                self._seen.pop(stopped, None)
        if self._pool_watches.listed():
            self._pools_synced = True  # no pool to watch: nothing to wait for

    def _pool_event(self, selection: str | None, event: WatchEvent[PoolStatus]) -> None:
        """An event of the watch of pool `selection` (None: of every pool of the namespace)."""
        match event:
            case Listed(items=items):
                # A list replaces what its watch covers: one pool, or the namespace.
                if selection is None:
                    self._seen = {}
                else:
                    self._seen.pop(selection, None)
                self._seen.update((s.name, s) for s in items)
                for name in list(self._pools):
                    if selection in (None, name):
                        self._feed(name, PoolObserved(self._seen.get(name)))
                if self._pool_watches is not None and self._pool_watches.listed():
                    self._pools_synced = True
            case Changed(item=status):
                self._seen[status.name] = status
                if status.name in self._pools:
                    self._feed(status.name, PoolObserved(status))
            case Deleted(name=name):
                self._seen.pop(name, None)
                if name in self._pools:
                    self._feed(name, PoolObserved(None))

    def _slice_services(self) -> frozenset[str] | None:
        """The Services whose EndpointSlices this router reads: its backends' (None, every
        Service of the namespace, when there are too many to name in a label selector)."""
        services = frozenset(b.service for b in self._config.backends if b.service is not None)
        return services if len(services) <= MAX_SELECTED_SERVICES else None

    def _start_slice_watch(self) -> None:
        """(Re)start the EndpointSlice watch on the backends' Services, while `run` runs."""
        if self._kube is None or self._tasks is None:
            return
        if self._slice_task is not None:
            self._slice_task.cancel()
        self._watched_services = self._slice_services()
        self._slice_task = self._tasks.create_task(
            self._watch_slices(self._kube, self._watched_services))

    async def _watch_slices(self, kube: KubePort, services: frozenset[str] | None) -> None:
        async for event in kube.watch_endpoint_slices(self._config.namespace, services):
            match event:
                case Listed(items=items):
                    self._endpoints.replace_all(items)
                    self._slices_synced = True
                case Changed(item=endpoint_slice):
                    self._endpoints.upsert(endpoint_slice)
                case Deleted(name=name):
                    self._endpoints.delete(name)
            self._refresh_ready()

    # --- endpoints ---

    def _refresh_ready(self) -> None:
        """Tell each pool's machine which members have a ready endpoint now."""
        now = self._clock()
        for name, state in list(self._pools.items()):
            ready = frozenset(
                m
                for m in state.limits.members
                if (b := self._config.backend_for_member(m)) is not None
                and b.service is not None
                and self._endpoints.ready_addresses(b.service, now, b.port)
            )
            if ready != state.ready:
                self._feed(name, EndpointsObserved(ready))
            else:
                self._sync_prober(name)  # a not-ready address may have come or gone

    def _pick(self, backend: BackendConfig) -> Target | None:
        if backend.service is None:
            return None
        address = self._endpoints.pick(backend.service, self._clock(), backend.port)
        if address is None and backend.pool in self._pools and backend.model_server:
            # Admitted on an early readiness answer: its address, until it turns ready.
            address = activator.early_address(self._pools[backend.pool], backend.model_server)
        if address is None:
            return None
        return Target(f"http://{address}", backend.name, backend.pool)

    # --- early readiness of a swap's target ---

    def _sync_prober(self, pool: str) -> None:
        """Start, keep or stop the pool's prober as its state and the endpoints say; and
        forget an early answer whose address is no longer listed (or was marked bad)."""
        state = self._pools[pool]
        now = self._clock()
        if state.early is not None:
            member, address = state.early
            backend = self._config.backend_for_member(member)
            service = backend.service if backend is not None else None
            port = backend.port if backend is not None else None
            if service is None or address not in (
                self._endpoints.not_ready_addresses(service, now, port)
            ):
                self._feed(pool, EarlyLost(member, address))  # syncs again
                return
        wanted = self._probe_wanted(state, now)
        if self._early.sync(pool, wanted, self._tasks):
            assert wanted is not None
            member, address, path = wanted
            logger.debug("pool %s: probing %s at %s%s", self._ref(pool), member, address, path)

    def _probe_wanted(self, state: PoolState, now: float) -> Wanted | None:
        """(member, address, path) to probe now, or None."""
        member = activator.probe_wanted(state)
        if member is None:
            return None
        backend = self._config.backend_for_member(member)
        if backend is None or backend.service is None or backend.readiness_path is None:
            return None  # no HTTP readiness path: wait for the endpoint to turn ready
        addresses = self._endpoints.not_ready_addresses(backend.service, now, backend.port)
        return (member, addresses[0], backend.readiness_path) if addresses else None

    def _answered_early(self, pool: str, member: str, address: str, path: str) -> None:
        logger.info(
            "pool %s: %s answered %s at %s before turning ready: dispatching there",
            self._ref(pool),
            member,
            path,
            address,
        )
        self._feed(pool, EarlyReady(member, address))


async def _logged(work: Awaitable[None]) -> None:
    """A write or re-read that fails unexpectedly is logged; the machine recovers at its
    next deadline (a held request never waits past its budget)."""
    try:
        await work
    except Exception:
        logger.exception("activation work failed")
