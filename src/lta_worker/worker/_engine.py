"""One pass (DESIGN.md, *One pass, as data flows*): a claimer leases due users in batches,
readers (`poll.concurrency`) take their turns (`_turn`), one writer commits the decisions.
Store calls go to a worker thread, so the loop reads on while one waits for the database.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Final

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from lta_worker.domain import (
    EXIT_CODES,
    TRIP_HINTS,
    Breaker,
    PolicyConfig,
    SchedulePlan,
    UserRow,
    UserUpdate,
)
from lta_worker.errors import EX_OK
from lta_worker.logs import get_logger
from lta_worker.pacing import PacerLike
from lta_worker.runtime import Clock
from lta_worker.worker._pass import (
    Interrupted,
    Lease,
    LeaseBook,
    PassOptions,
    PassResult,
    PassStop,
    ProgressFn,
    Reader,
    ReadObserver,
    lease_of,
    on_thread,
    read_margin,
    renewal_period,
)
from lta_worker.worker._turn import (
    Turns,
    log_changes,
)

if TYPE_CHECKING:
    from lta_worker.storage import Store, Vault

Held = tuple[UserRow, UserUpdate]

log = get_logger("lta_worker.engine")

# The writer commits every WRITE_LINGER_S, or sooner at WRITE_BATCH decisions (at 50 a
# commit, a trip to the store's thread, B1's worker took 7 % more CPU per read than at 250).
WRITE_BATCH: Final = 250
WRITE_LINGER_S: Final = 0.5


class DecisionWriter:
    """Writes one pass's decisions; knows the rows of the users whose turn is not written."""

    def __init__(self, store: Store, instance: str, clock: Clock, leases: LeaseBook) -> None:
        self.store = store
        self.instance = instance
        self.clock = clock
        self.leases = leases
        self.pending: list[UserUpdate] = []
        # The rows of the turns not written yet, per lease (a user claimed again has two).
        self.claimed: dict[Lease, UserRow] = {}

    async def run(self, updates: ObjectReceiveStream[UserUpdate]) -> None:
        """Commit what comes, batch by batch, until the readers are done (`WRITE_LINGER_S`)."""
        async with updates:
            closed = False
            while not closed:
                with anyio.move_on_after(WRITE_LINGER_S):
                    while len(self.pending) < WRITE_BATCH:
                        try:
                            self.pending.append(await updates.receive())
                        except anyio.EndOfStream:
                            closed = True
                            break
                await self.flush()

    async def flush(self) -> None:
        """Commit the pending decisions in one transaction, then log what it did."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        discarded: list[tuple[UserUpdate, str]] = []
        with anyio.CancelScope(shield=True):  # a batch is written whole or not at all
            now = self.clock.now()
            await on_thread(self.store.apply, batch, self.instance, now=now, discarded=discarded)
        not_written = {id(update): reason for update, reason in discarded}
        for update in batch:  # a pass over a million users keeps only the unwritten rows
            lease = (update.user_id, update.generation)
            user = self.claimed.pop(lease, None)
            self.leases.forget(lease)
            reason = not_written.get(id(update))
            if reason is not None:
                # `changed` (the user changed since the claim, and wins) or `failed` (its
                # write alone was refused): the decision's changes did not happen.
                name = user.user if user is not None else str(update.user_id)
                log.warning("poll.discarded", user=name, reason=reason, outcome=update.last_outcome)
            elif user is not None:
                # Only now that the write is committed are its changes true.
                log_changes(user, update)


class PassEngine:
    """Runs one pass over injected collaborators (STYLE 4)."""

    def __init__(
        self,
        *,
        store: Store,
        vault: Vault,
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

    def follow(self, policy: PolicyConfig | None = None, plan: SchedulePlan | None = None) -> None:
        """Decide the turns from now on under `policy` (a reload's) or `plan` (`BudgetWatch`)."""
        old = self.options.policy
        new = replace(policy or old, plan=old.plan if plan is None else plan)
        self.options = replace(self.options, policy=new)
        self.turns.options = self.options

    async def _deadline(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self.stop.request("deadline", self.options.grace.total_seconds())

    async def run(self) -> PassResult:
        """Run the pass to its end and return how it ended; never raises for upstream trouble,
        only UnknownKeyError (a stored token's key id the key file lacks)."""
        opts = self.options
        started = self.clock.monotonic()
        started_at = self.clock.now()
        self.due_at_start = await on_thread(self.store.count_due, started_at)
        # Nobody due (most ticks of `serve`): at debug, so an idle service logs nothing.
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
            await on_thread(self.store.release, opts.instance)
        if self.turns.lapsed:
            log.warning(
                "pass.lease_lapsed",
                instance=opts.instance,
                users=self.turns.lapsed,
                hint="the lease renewals did not reach the database in time (a stalled or slow "
                "database): these users were not read, so that no other instance reads them "
                "too; they stay due",
            )
        if stopped == "breaker":
            self.result.cause = cause = self.breaker.cause
            log.error(
                "pass.breaker_tripped",
                instance=opts.instance,
                cause=cause,
                proof="service" if self.breaker.proven else "users",
                rejected=self.result.counts["rejected"],
                hint=TRIP_HINTS[cause],
            )
        if stopped == "upstream_down" and not self.breaker.answered:
            log.error(
                "pass.unreachable",
                instance=opts.instance,
                reads=self.result.reads,
                hint="no read got any answer (network failures only): the service is "
                "unreachable from here, or service.base_url names the wrong host; the users "
                "tried are backed off (a failure counted, read again within poll.interval), "
                "the others stay due",
            )
        self.result.stopped = stopped
        self.result.exit_code = EXIT_CODES[stopped]
        self.result.wall_s = self.clock.monotonic() - started
        level = "info" if stopped in {"completed", "cancelled"} else "warning"
        if stopped == "completed" and not (self.result.users or self.result.reads):
            level = "debug"
        getattr(log, level)("pass.finished", instance=opts.instance, **self.result.summary())

    async def _claimer(self, send: ObjectSendStream[UserRow], due_before: datetime) -> None:
        opts = self.options
        async with send:
            while not self.stop.requested.is_set():
                now = self.clock.now()
                lease_until = now + opts.lease_duration
                batch: Sequence[UserRow] = await on_thread(
                    self.store.claim_due,
                    now=now,
                    due_before=due_before,
                    limit=opts.batch_size,
                    owner=opts.instance,
                    lease_until=lease_until,
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
                await on_thread(self.store.renew_leases, opts.instance, renewal.lease_until, held)
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
