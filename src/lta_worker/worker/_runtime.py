"""The runtime of `run` and `serve`: a `Runtime` opened for passes.

`Worker` is the composition root (store, vault, API client, pacer, clock) with what a
process that passes needs besides: it reads the secret files, opens the store in a worker
thread, loads the rest (`Runtime.start`), takes the single-instance lock on SQLite (so that
a broken file is named before another instance's lock), and registers the instance; it
closes everything on exit. It is what the pass (`_run`) and the periodic jobs (`_jobs`) take.
Tests build it with the simulator's transport and their own clock.
"""

from __future__ import annotations

import os
import random
import secrets
import socket
from collections.abc import Iterable
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Self

import anyio

from lta_worker.config import Settings
from lta_worker.errors import LtaError
from lta_worker.logs import get_logger
from lta_worker.report import PlanCache
from lta_worker.runtime import Clock, Runtime
from lta_worker.worker._pass import PassResult, ProgressFn
from lta_worker.worker._run import run_pass

if TYPE_CHECKING:
    import httpx

    from lta_worker.worker._engine import PassEngine
    from lta_worker.worker._metrics import Metrics

log = get_logger("lta_worker.runner")


def _log_lease_expired(owner: str, users: int) -> None:
    log.warning("instance.lease_expired", instance=owner, users=users)


def new_instance_id() -> str:
    """A readable, unique instance id: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


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
        self.instance = new_instance_id()
        self._opened = AsyncExitStack()  # what `__aenter__` opened, closed in reverse
        self.current: PassEngine | None = None  # the engine of the pass in progress
        self.stop_grace: float | None = None  # set by `request_stop`
        self.plans = PlanCache()  # the freshness plan, renewed every few minutes
        self.key_file_problem: str | None = None  # `watch_key_file`'s last finding
        # A reload changed the intervals: the next pass re-plans every user (`follow_schedule`),
        # taking the longest `poll.interval` this instance scheduled with since as the floor
        # of the adaptive due times it wrote. None: nothing to re-plan.
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
                await self._db(store.prune_instances, self.clock.now(), timedelta(0))
                for owner, users in (await self._db(store.release_all)).items():
                    _log_lease_expired(owner, users)
                await self._db(store.release_events, self.clock.now())
            await self._db(store.register_instance, self.instance, self.kind, self.clock.now())
            stack.callback(store.unregister, self.instance)
            if self.metrics is not None:
                await self._db(self.metrics.on_store, store, self.clock.now(), history=True)
                if self.settings.metrics.textfile is not None:
                    await self._db(self.metrics.resume_counters, self.settings.metrics.textfile)
                seen = await self._db(store.budget_seen, self.settings.client.id)
                self.metrics.on_budget_seen(seen, self.clock.now())
        except BaseException:
            await stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self._opened.aclose()

    async def _db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (`request_stop`): no pass or drop starts any more."""
        return self.stop_grace is not None

    async def run_pass(
        self, *, max_duration: timedelta | None = None, on_progress: ProgressFn | None = None
    ) -> PassResult:
        """One pass with the jobs around it (`_run.run_pass`)."""
        return await run_pass(self, max_duration=max_duration, on_progress=on_progress)

    def request_stop(self, grace: float) -> None:
        """Stop the pass in progress, and any later one before it claims a user (SIGTERM).

        A pass may be between its start and its engine when the signal comes; it sees
        the request as soon as its engine exists, so it never runs on unstopped.
        """
        self.stop_grace = grace
        if self.current is not None:
            self.current.request_stop("cancelled", grace)

    def reload(self, settings: Settings, *, key_ids_in_use: Iterable[str] = ()) -> None:
        """Re-read the key file and the client secret and take the new settings (SIGHUP,
        `Runtime.reload`): a key file that lacks one of `key_ids_in_use` leaves the worker
        as it was, and the next pass would otherwise stop at the first such token.

        The pass in progress decides its next turns under the new policy (it may last as
        long as users stay due); when the intervals changed, the next pass re-plans every
        user, also those this pass scheduled under the old ones after another instance had
        applied the new ones (`follow_schedule`)."""
        before = self.settings.poll
        super().reload(settings, key_ids_in_use=key_ids_in_use)
        self.breaker_retry_at = None  # the new secret or URLs may have fixed the cause
        poll = self.settings.poll
        if self.current is not None:
            self.current.follow(poll.policy())
        if (poll.interval, poll.parked_interval) != (before.interval, before.parked_interval):
            self.replan = max(self.replan or before.interval, before.interval)

    def watch_key_file(self) -> str | None:
        """Read the key file again and compare it with the keys in force: what is wrong
        with it (deleted, unreadable, broken, or lacking a key in force: its key id gone,
        or another key under that id), or None. The keys in force stay as they are either
        way; the problem is kept for health (`problems`) until the file is right again."""
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
