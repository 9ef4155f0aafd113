"""One pass over the due users: claim, read, classify, decide, write.

The I/O shell around the pure modules (classify, policy, pacer core). Data flow:

    claimer ──users──▶ readers (poll.concurrency) ──updates──▶ writer ──▶ store.apply
                          │  ▲
                          ▼  │ permits
                         pacer

- The claimer leases due users in batches, oldest `next_due_at` first, only those due when
  the pass started (a user backed off during the pass waits for the next one).
- A reader takes one user's turn (`_turn`): decrypt the token, call each endpoint the user
  granted with it (pacer permit first, the lease checked; the API client adds the client
  secret, which the engine never holds, and marks a body that echoes a credential),
  classify, stop at an outcome that ends the turn, let the policy decide. Decisions go to
  the single writer (`_writer`), which commits them in batches, fenced by the generation
  each user was claimed with.
- Every rule lives elsewhere and is pure: what an outcome does to a user, whether a read
  goes again after a 429, what proves the client accepted (`domain` policy table); when
  decisions are held, released or dropped and when the pass must stop (`domain.Breaker`:
  plain 401s with nothing authenticated, 404s with nothing proving the URLs, each asking a
  proof of the service that spends no read budget; failures in a row). The engine only
  moves users, answers, proofs and decisions between them.
- Store calls (claims, lease renewals, the writer's commits) all go to a worker thread, on
  SQLite as on PostgreSQL: one may wait for the database's lock (an operator's command,
  `serve`'s other jobs), a claim or a commit's fsync, and the loop goes on reading meanwhile.
- The pass ends when no due user is left (0), at the deadline or when the service seems
  down, or no read got any answer at all (75: the rest stays due), or at the breaker (78).
- A stop (deadline, SIGTERM in `serve`) lets reads already sent finish (`_stop`); the users
  not read stay due, and what a turn read before the stop is kept. A turn whose user's
  lease may lapse before its read would end is given up the same way, and the pass logs
  `pass.lease_lapsed` once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from lta_worker.domain import (
    EXIT_CODES,
    Breaker,
    PolicyConfig,
    SchedulePlan,
    StopReason,
    UserRow,
    UserUpdate,
)
from lta_worker.errors import EX_OK
from lta_worker.logs import get_logger
from lta_worker.pacing import PacerLike
from lta_worker.runtime import Clock
from lta_worker.worker import _pass_log as events
from lta_worker.worker._lease_book import LeaseBook, lease_of, read_margin, renewal_period
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, ReadObserver
from lta_worker.worker._ports import PassStore, Reader, TokenVault
from lta_worker.worker._stop import Interrupted, PassStop
from lta_worker.worker._turn import Turns
from lta_worker.worker._writer import WRITE_BATCH, DecisionWriter

Held = tuple[UserRow, UserUpdate]

log = get_logger("lta_worker.engine")


class PassEngine:
    """Runs one pass. Collaborators are injected (STYLE 4): tests plug in the simulator."""

    def __init__(
        self,
        *,
        store: PassStore,
        vault: TokenVault,
        api: Reader,
        pacer: PacerLike,
        clock: Clock,
        options: PassOptions,
        rng: random.Random | None = None,
        on_progress: ProgressFn | None = None,
        on_read: ReadObserver | None = None,
    ) -> None:
        self.store = store
        self.pacer = pacer
        self.clock = clock
        self.options = options
        self.on_progress = on_progress
        self.result = PassResult(stopped="completed", exit_code=EX_OK)
        self.due_at_start = 0
        self.breaker: Breaker[Held] = Breaker(
            options.breaker_threshold, options.upstream_down_after
        )
        self.stop = PassStop(clock)
        self._leases = LeaseBook()
        self.writer = DecisionWriter(store, options.instance, clock, self._leases)
        self.turns = Turns(
            vault=vault,
            api=api,
            pacer=pacer,
            clock=clock,
            options=options,
            rng=rng or random.Random(),
            stop=self.stop,
            leases=self._leases,
            breaker=self.breaker,
            result=self.result,
            read_margin=read_margin(options.lease_duration, options.request_timeout),
            on_read=on_read,
        )

    def follow(self, policy: PolicyConfig) -> None:
        """Decide the turns from now on under `policy` (a reload's: SIGHUP), keeping the
        pass's freshness plan; a pass may last as long as users stay due, and the users it
        reads must be due at the interval in force, not the one it started under."""
        self.options = replace(self.options, policy=replace(policy, plan=self.options.policy.plan))
        self.turns.options = self.options

    def follow_plan(self, plan: SchedulePlan) -> None:
        """Decide the turns from now on with `plan`, made again because the budget the
        service reports moved (`_budget_watch`), keeping the policy in force."""
        self.options = replace(self.options, policy=replace(self.options.policy, plan=plan))
        self.turns.options = self.options

    def request_stop(self, reason: StopReason, grace: float) -> None:
        """Stop claiming; readers finish the users they hold, and are cancelled after `grace`.

        Used at the deadline, when the service seems down, and on SIGTERM in `serve`.
        Readers still waiting for a permit give their users up at once (they stay due).
        """
        self.stop.request(reason, grace)

    async def _deadline(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self.request_stop("deadline", self.options.grace.total_seconds())

    # -- the pass ------------------------------------------------------------------------

    async def run(self) -> PassResult:
        """Run the pass to its end and return how it ended; never raises for upstream trouble.

        Raises:
            UnknownKeyError: a stored token's key id is not in the key file (the pass stops
                first; nothing of that user is modified).
        """
        opts = self.options
        started = self.clock.monotonic()
        started_at = self.clock.now()
        self.due_at_start = await self._db(self.store.count_due, started_at)
        # Nobody due (most ticks of `serve`): at debug, with its `pass.finished`, so that an
        # idle service does not log two lines a minute.
        (log.info if self.due_at_start else log.debug)(
            "pass.started",
            instance=opts.instance,
            due=self.due_at_start,
            deadline_s=opts.max_duration.total_seconds(),
            concurrency=opts.concurrency,
        )
        users_send, users_recv = anyio.create_memory_object_stream[UserRow](opts.concurrency)
        updates_send, updates_recv = anyio.create_memory_object_stream[UserUpdate](WRITE_BATCH)
        with anyio.CancelScope() as self.stop.scope:
            try:
                async with anyio.create_task_group() as tasks:
                    self.stop.tasks = tasks
                    keeper = anyio.CancelScope()
                    tasks.start_soon(self._lease_keeper, keeper)
                    tasks.start_soon(self._deadline, opts.max_duration.total_seconds())
                    tasks.start_soon(self._claimer, users_send, started_at)
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(self.writer.run, updates_recv)
                        async with updates_send, users_recv:
                            for _ in range(opts.concurrency):
                                inner.start_soon(
                                    self._reader, users_recv.clone(), updates_send.clone()
                                )
                    tasks.cancel_scope.cancel()  # readers and writer are done
            finally:
                # Ended: a stop from now on (SIGTERM while the pass writes its end) has no
                # reader left to cancel, and a task group that is done takes no new task.
                self.stop.tasks = None
        await self._finish(started)
        if self.stop.reason == "config" and self.turns.fatal_error is not None:
            raise self.turns.fatal_error
        return self.result

    async def _finish(self, started: float) -> None:
        opts = self.options
        if self.stop.reason is None:  # completed: what still waits for a proof gets it
            with anyio.CancelScope(shield=True):
                for proof in self.breaker.wanted():
                    await self.turns.prove(proof)
        stopped, released = self.breaker.finish(self.stop.reason or "completed")
        with anyio.CancelScope(shield=True):
            for _user, update in released:
                self.writer.pending.append(update)
            await self.writer.flush()
            self.writer.claimed.clear()  # what was held and dropped is never written
            await self._db(self.store.release, opts.instance)
        if self.turns.lapsed:
            events.lease_lapsed(opts.instance, self.turns.lapsed)
        if stopped == "breaker":
            events.breaker(opts.instance, self.breaker, self.result.counts["rejected"])
            self.result.cause = self.breaker.cause
        if stopped == "upstream_down" and not self.breaker.answered:
            events.unreachable(opts.instance, self.result.reads)
        self.result.stopped = stopped
        self.result.exit_code = EXIT_CODES[stopped]
        self.result.wall_s = self.clock.monotonic() - started
        # A pass that stopped early (deadline, breaker, service down) is a warning; a
        # completed one, or one stopped on purpose (SIGTERM), is info; one that completed
        # having done nothing (nobody due) is debug.
        level = "info" if stopped in {"completed", "cancelled"} else "warning"
        if stopped == "completed" and not (self.result.users or self.result.reads):
            level = "debug"
        getattr(log, level)("pass.finished", instance=opts.instance, **self.result.summary())

    # -- tasks ---------------------------------------------------------------------------

    async def _claimer(self, send: ObjectSendStream[UserRow], due_before: datetime) -> None:
        opts = self.options
        async with send:
            while not self.stop.requested.is_set():
                now = self.clock.now()
                lease_until = now + opts.lease_duration
                batch: Sequence[UserRow] = await self._db(
                    partial(
                        self.store.claim_due,
                        now=now,
                        due_before=due_before,
                        limit=opts.batch_size,
                        owner=opts.instance,
                        lease_until=lease_until,
                    )
                )
                self._leases.claimed((lease_of(user) for user in batch), lease_until)
                if not batch:
                    return
                for user in batch:
                    if self.stop.requested.is_set():
                        return
                    await send.send(user)

    async def _lease_keeper(self, scope: anyio.CancelScope) -> None:
        opts = self.options
        period = max(renewal_period(opts.lease_duration).total_seconds(), 0.05)
        with scope:
            while True:
                await self.clock.sleep(period)
                # The expiry written is computed before the call, but counts as held only
                # once the call returned, and not for users whose lease lapsed meanwhile.
                renewal = self._leases.renewing(self.clock.now() + opts.lease_duration)
                held: set[tuple[int, int]] = set()
                await self._db(self.store.renew_leases, opts.instance, renewal.lease_until, held)
                self._leases.renewed(renewal, self.clock.now(), held)

    async def _reader(
        self, users: ObjectReceiveStream[UserRow], updates: ObjectSendStream[UserUpdate]
    ) -> None:
        async with users, updates:
            async for user in users:
                if self.stop.requested.is_set():
                    continue  # claimed but not started: its lease is released at the end
                self.writer.claimed[lease_of(user)] = user
                try:
                    update = await self.turns.turn(user)
                except Interrupted:
                    self._leases.forget(lease_of(user))
                    continue  # stopped while waiting for a permit: the user stays due
                if update is not None:
                    await self._route(user, update, updates)
                else:  # its token went meanwhile: nothing to write
                    self.writer.claimed.pop(lease_of(user), None)
                self.turns.saw_404.discard(user.id)  # routed: a pass keeps nothing per user read
                if self.on_progress is not None:
                    self.on_progress(self)

    async def _route(
        self, user: UserRow, update: UserUpdate, updates: ObjectSendStream[UserUpdate]
    ) -> None:
        """Send a decision to the writer, unless the breaker holds it for now."""
        routed = self.breaker.route(
            (user, update),
            saw_404=user.id in self.turns.saw_404,
            rejected=update.last_outcome == "rejected",
        )
        if routed.trip:
            self.stop.abort("breaker")
        if routed.check is not None:
            await self.turns.prove(routed.check)
        for _held_user, held_update in routed.release:
            await updates.send(held_update)

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store call, on a worker thread: it may wait for the database (see the module)."""
        return await anyio.to_thread.run_sync(partial(fn, *args))
