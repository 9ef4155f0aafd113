"""`Worker`: a `Runtime` opened for passes, each with the jobs of `_jobs` around it, and
the plan made again within a pass once the budget moves (`BudgetWatch`).
"""

from __future__ import annotations

import os
import random
import secrets
import socket
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Self

import anyio

from lta_worker.config import Settings
from lta_worker.errors import LtaError
from lta_worker.logs import get_logger
from lta_worker.report import PlanCache, budget_moved
from lta_worker.runtime import Clock, Runtime
from lta_worker.worker import _jobs as jobs
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassResult, ProgressFn, on_thread, pass_options

if TYPE_CHECKING:
    import httpx

    from lta_worker.domain import Answer, BudgetSeen, Endpoint, Proof, SchedulePlan
    from lta_worker.secret import Secret
    from lta_worker.worker._metrics import Metrics

log = get_logger("lta_worker.runner")


def _log_lease_expired(owner: str, users: int) -> None:
    log.warning("instance.lease_expired", instance=owner, users=users)


class Worker(Runtime):
    """A `Runtime` opened for passes; `async with Worker(settings) as w: ...`."""

    def __init__(
        self,
        settings: Settings,
        *,
        kind: str = "run",
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        webhook_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            settings, clock=clock, transport=transport, webhook_transport=webhook_transport
        )
        if metrics is None and (settings.metrics.listen or settings.metrics.textfile):
            from lta_worker.worker._metrics import Metrics

            metrics = Metrics()
        self.metrics = metrics
        self.kind = kind
        self.rng = rng
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self._opened = AsyncExitStack()  # what `__aenter__` opened, closed in reverse
        self.current: PassEngine | None = None  # the engine of the pass in progress
        self.stop_grace: float | None = None  # set by `request_stop`
        self.plans = PlanCache()  # the freshness plan, renewed every few minutes
        self.key_file_problem: str | None = None  # `watch_key_file`'s last finding
        # After a reload changed the intervals: the longest `poll.interval` this instance
        # planned with since, the floor for the next pass's `follow_schedule`.
        self.replan: timedelta | None = None
        # `serve`: when a tripped breaker lets a pass run again; a reload clears it.
        self.breaker_retry_at: datetime | None = None

    async def __aenter__(self) -> Self:
        stack = self._opened
        try:
            await super().__aenter__()
            stack.push_async_exit(super().__aexit__)
            for read in self.secret_files().values():  # a broken file first: it needs fixing
                read()
            store = await anyio.to_thread.run_sync(lambda: self.store)
            store.on_lease_expired = _log_lease_expired
            await self.start()  # the key file too, before another instance's lock is named
            stack.enter_context(store.single_instance_lock())
            if store.dialect == "sqlite":  # the lock proves every other one dead
                await on_thread(store.prune_instances, self.clock.now(), timedelta(0))
                for owner, users in (await on_thread(store.release_all)).items():
                    _log_lease_expired(owner, users)
                await on_thread(store.release_events, self.clock.now())
            await on_thread(store.register_instance, self.instance, self.kind, self.clock.now())
            stack.callback(store.unregister, self.instance)
            if self.metrics is not None:
                await on_thread(self.metrics.on_store, store, self.clock.now(), history=True)
                if self.settings.metrics.textfile is not None:
                    await on_thread(self.metrics.resume_counters, self.settings.metrics.textfile)
                seen = await on_thread(store.budget_seen, self.settings.client.id)
                self.metrics.on_budget_seen(seen, self.clock.now())
        except BaseException:
            await stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self._opened.aclose()

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (`request_stop`): no pass or drop starts any more."""
        return self.stop_grace is not None

    async def run_pass(
        self, *, max_duration: timedelta | None = None, on_progress: ProgressFn | None = None
    ) -> PassResult:
        """The jobs before a pass (pending drops sent again through the pacer), the pass
        with its jobs alongside, then its bookkeeping."""
        await jobs.refresh_share(self)
        await jobs.follow_schedule(self)
        await jobs.retry_drops(self)
        watch = BudgetWatch(self)
        engine = await self._engine(max_duration, on_progress, watch)
        if self.stop_grace is not None:  # a stop came before the engine existed
            engine.stop.request("cancelled", self.stop_grace)
        self.current = engine
        started_at = self.clock.now()
        error: Exception | None = None
        shared = self.pacer.shared
        try:
            async with anyio.create_task_group() as alongside:
                alongside.start_soon(jobs.keep_alive, self)
                alongside.start_soon(watch.run, engine)
                if shared is not None:
                    alongside.start_soon(jobs.settle_shared, self, shared)
                try:
                    result = await engine.run()
                except Exception as exc:  # raised below, outside the task group
                    error = exc
                alongside.cancel_scope.cancel()
        finally:
            self.current = None
            if shared is not None:
                with anyio.CancelScope(shield=True):
                    await shared.flush(release=True)
        if error is not None:
            raise error
        with anyio.CancelScope(shield=True):
            await jobs.after_pass(self, result, started_at)
        # `run` delivers the pass's events before it exits; `serve` from its own job, so a
        # slow receiver never holds the next pass.
        if self.stop_grace is None and self.kind != "serve":
            await jobs.deliver_webhooks(self)
        return result

    async def _engine(
        self,
        max_duration: timedelta | None,
        on_progress: ProgressFn | None,
        watch: BudgetWatch,
    ) -> PassEngine:
        """The engine of one pass (its plan made again when `watch` sees the budget move)."""
        plan = await make_plan(self)
        # After the wait: a reload meanwhile is in force from the first turn (none can come
        # between here and `self.current`, where a later one reaches the engine).
        options = pass_options(self.settings, self.instance, max_duration)
        options = replace(options, policy=replace(options.policy, plan=plan))
        return PassEngine(
            store=self.store,
            vault=self.vault,
            api=_ApiOnFirstRead(self),
            pacer=self.pacer if self.metrics is None else self.metrics.metered(self.pacer),
            clock=self.clock,
            options=options,
            rng=self.rng,
            on_progress=on_progress,
            on_read=watch.on_read,
        )

    def request_stop(self, grace: float) -> None:
        """Stop the pass in progress, and any later one before it claims a user (SIGTERM)."""
        self.stop_grace = grace
        if self.current is not None:
            self.current.stop.request("cancelled", grace)

    def reload(self, settings: Settings, *, key_ids_in_use: Iterable[str] = ()) -> None:
        """Take new settings, key file and client secret (SIGHUP): the pass in progress
        follows the new policy, and new intervals re-plan every user at the next pass."""
        before = self.settings.poll
        super().reload(settings, key_ids_in_use=key_ids_in_use)
        self.breaker_retry_at = None  # the new secret or URLs may have fixed the cause
        poll = self.settings.poll
        if self.current is not None:
            self.current.follow(poll.policy())
        if (poll.interval, poll.parked_interval) != (before.interval, before.parked_interval):
            self.replan = max(self.replan or before.interval, before.interval)

    def watch_key_file(self) -> str | None:
        """What is wrong with the key file on disk against the keys in force (kept for
        `problems`), or None; the keys in force stay."""
        try:
            on_disk = self.read_key_file()
        except LtaError as exc:
            problem: str | None = exc.message
        else:
            lost = self.vault.keys_missing_from(on_disk)
            problem = (
                f"crypto.key_file: the key file no longer holds the key(s) in force under "
                f"key id(s) {', '.join(map(repr, lost))}"
                if lost
                else None
            )
        self.key_file_problem = problem
        return problem

    def problems(self) -> list[str]:
        """What this process knows is wrong beyond the database (for `/healthz`)."""
        if self.key_file_problem is None:
            return []
        return [
            f"{self.key_file_problem}; running on the keys read at start: restore the file "
            "before a restart or SIGHUP"
        ]


class _ApiOnFirstRead:
    """The pass's reader: the API client, built at the first read (none if nobody is due)."""

    __slots__ = ("_rt",)

    def __init__(self, rt: Worker) -> None:
        self._rt = rt

    async def read(self, endpoint: Endpoint, token: Secret) -> Answer:
        return await self._rt.api.read(endpoint, token)

    async def prove(self, proof: Proof) -> bool | None:
        """`ApiClient.client_accepted` or `ApiClient.read_path_found`."""
        api = self._rt.api
        return await (api.client_accepted() if proof == "client" else api.read_path_found())


# A plan made before the first answer (or a quota change) spaces users for a budget that is
# not there: once the budget moves it is stored and the plan made again, at most every
# REPLAN_GAP (a swinging budget costs one scan of the users table per gap, not per read).
REPLAN_GAP: Final = timedelta(seconds=60)


async def make_plan(rt: Worker, seen: BudgetSeen | None = None) -> SchedulePlan:
    """The freshness plan from the runtime's cache (on a worker thread), for the metrics too."""
    plan = await anyio.to_thread.run_sync(
        rt.plans.get, rt.store, rt.settings, rt.settings.poll.policy(), rt.clock.now(), seen
    )
    if rt.metrics is not None:
        rt.metrics.on_plan(plan)
    return plan


class BudgetWatch:
    """The engine's read observer (`on_read`) and the job alongside the pass (`run`)."""

    def __init__(self, rt: Worker) -> None:
        self._rt = rt
        self._moved = anyio.Event()

    def on_read(self, endpoint: str, outcome: str, duration_s: float) -> None:
        """After each read (the pacer fed its answer): wake `run` if the budget moved."""
        rt = self._rt
        if rt.metrics is not None:
            rt.metrics.on_read(endpoint, outcome, duration_s)
        if rt.settings.poll.schedule != "adaptive" or self._moved.is_set():
            return
        if budget_moved(rt.plans.seen, rt.pacer.budget_seen(rt.clock.now())):
            self._moved.set()

    async def run(self, engine: PassEngine) -> None:
        """Until cancelled: each time the budget moved, store it, plan again, follow."""
        rt = self._rt
        while True:
            await self._moved.wait()
            seen = rt.pacer.budget_seen(rt.clock.now())
            await jobs.keep_budget(rt)
            engine.follow(plan=await make_plan(rt, seen))
            await rt.clock.sleep(REPLAN_GAP.total_seconds())
            # Only now: the reads answered meanwhile are compared with the new plan's budget.
            self._moved = anyio.Event()
