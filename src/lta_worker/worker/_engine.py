"""One pass over the due users: claim, read, classify, decide, write.

The I/O shell around the pure modules (classify, policy, pacer core). Data flow:

    claimer ──users──▶ readers (poll.concurrency) ──updates──▶ writer ──▶ store.apply
                          │  ▲
                          ▼  │ permits
                         pacer

- The claimer leases due users in batches, oldest `next_due_at` first, only those due when
  the pass started (a user backed off during the pass waits for the next one).
- A reader takes one user's turn: decrypt the token, call each endpoint the user granted
  (pacer permit first), classify, stop at an outcome that ends the turn, let the policy
  decide. Decisions go to the single writer, which commits what came in the last half
  second (at most `WRITE_BATCH` decisions) in one transaction.
- Every rule lives elsewhere and is pure: what an outcome does to a user, whether a read
  goes again after a 429, what proves the client accepted (`domain` policy table); when
  decisions are held, released or dropped and when the pass must stop (`domain.Breaker`:
  plain 401s with nothing authenticated, 404s with nothing proving the URLs, failures in
  a row). The engine only moves users, answers and decisions between them.
- Fencing: every decision carries the generation its user was claimed with, and the store
  writes it only while the row still has it (a lifecycle command changed nothing since);
  otherwise it is discarded with a `poll.discarded` event. So are the decisions of users
  whose write failed (the others of the batch are written; the user stays due).
- Store calls (claims, lease renewals, the writer's commits) all go to a worker thread, on
  SQLite as on PostgreSQL: one may wait for the database's lock (an operator's command,
  `serve`'s other jobs), a claim or a commit's fsync, and the loop goes on reading meanwhile.
- The pass ends when no due user is left (0), at the deadline or when the service seems
  down, or no read got any answer at all (75: the rest stays due), or at the breaker (78).
- A stop (deadline, SIGTERM in `serve`) lets reads already sent finish; a reader still
  waiting for a pacer permit gives its turn up at once, so a tight budget never holds a
  stop for the whole grace period. The user stays due; what its turn read before the stop
  is kept.
- A read is sent only while its user's lease is certainly held until the read's end
  (`service.request_timeout` before the lease's end, `_lease_book`): when the database
  stalls longer than a lease, renewals land late and the lease may lapse, and another
  instance may claim the user. Such a turn is given up like a stop (the user stays due)
  and the pass logs `pass.lease_lapsed` once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any, Final

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream, TaskGroup

from lta_worker.domain import (
    EXIT_CODES,
    Breaker,
    Endpoint,
    Outcome,
    StopReason,
    UserRow,
    UserUpdate,
    classify,
    decide_turn,
    echoes,
    endpoints_to_call,
    ends_turn,
    read_again,
    still_wanted,
)
from lta_worker.errors import EX_OK, UnknownKeyError
from lta_worker.logs import get_logger
from lta_worker.pacing import PacerLike, Permit, wait_after_429
from lta_worker.secret import Secret
from lta_worker.storage import TokenDecryptError
from lta_worker.worker import _pass_log as events
from lta_worker.worker._clock import Clock
from lta_worker.worker._lease_book import LeaseBook, read_margin, renewal_period
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, ReadObserver
from lta_worker.worker._ports import PassStore, Reader, TokenVault

# The writer commits every WRITE_LINGER_S, or sooner at WRITE_BATCH decisions. A commit
# is a trip to the store's thread, which costs more than its statements: the thread runs
# on another core, whose caches hold none of it (pinned to one core, the cost was gone).
# At 50 decisions a commit B1's worker took 7 % more CPU per read than at 250. At usual
# budgets (a few reads a minute) a commit holds one decision, half a second after it.
WRITE_BATCH: Final = 250
WRITE_LINGER_S: Final = 0.5
Held = tuple[UserRow, UserUpdate]

log = get_logger("lta_worker.engine")


class _Interrupted(Exception):
    """A turn given up because the pass stopped while it waited for a permit."""


class _LeaseLapsed(_Interrupted):
    """A turn given up because its user's lease may lapse before a read would end."""


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
        client_secret: Secret,
        options: PassOptions,
        rng: random.Random | None = None,
        on_progress: ProgressFn | None = None,
        on_read: ReadObserver | None = None,
    ) -> None:
        self.store = store
        self.vault = vault
        self.api = api
        self.pacer = pacer
        self.clock = clock
        self.client_secret = client_secret
        # What a success body must not hold (`echoes`); a secret too short to be told from
        # data (the log redactor's bound) is not looked for.
        raw_secret = client_secret.reveal().encode()
        self._secret_bytes = (raw_secret,) if len(raw_secret) >= 6 else ()
        self.options = options
        self.rng = rng or random.Random()
        self.on_progress = on_progress
        self.on_read = on_read
        self.result = PassResult(stopped="completed", exit_code=EX_OK)
        self.due_at_start = 0
        self.breaker: Breaker[Held] = Breaker(
            options.breaker_threshold, options.upstream_down_after
        )
        self._stopping = anyio.Event()
        self._stop_reason: StopReason | None = None
        self._fatal_error: Exception | None = None
        self._scope: anyio.CancelScope | None = None
        self._permit_waits: set[anyio.CancelScope] = set()
        self._tg: TaskGroup | None = None
        self._saw_404: set[int] = set()
        # The rows of the users whose turn is not written yet: the name for
        # `poll.discarded`, the state before for the events of a decision written.
        self._claimed: dict[int, UserRow] = {}
        self._leases = LeaseBook()
        self._read_margin = read_margin(options.lease_duration, options.request_timeout)
        self._lapsed = 0  # users whose turn was given up for their lease (`_LeaseLapsed`)
        self._pending: list[UserUpdate] = []
        self._read_log: Any = events.pass_logger()  # an engine runs one pass

    # -- control -------------------------------------------------------------------------

    def request_stop(self, reason: StopReason, grace: float) -> None:
        """Stop claiming; readers finish the users they hold, and are cancelled after `grace`.

        Used at the deadline, when the service seems down, and on SIGTERM in `serve`.
        Readers still waiting for a permit give their users up at once (they stay due).
        """
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stopping.set()
        for scope in self._permit_waits:
            scope.cancel()
        if self._tg is not None and grace >= 0:
            self._tg.start_soon(self._cancel_after, grace)

    def _abort(self, reason: StopReason) -> None:
        """Stop at once, dropping what is in flight (breaker, fatal configuration error)."""
        self._stop_reason = reason
        self._stopping.set()
        if self._scope is not None:
            self._scope.cancel()

    async def _cancel_after(self, grace: float) -> None:
        await self.clock.sleep(grace)
        if self._scope is not None:
            self._scope.cancel()

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
        with anyio.CancelScope() as self._scope:
            try:
                async with anyio.create_task_group() as self._tg:
                    keeper = anyio.CancelScope()
                    self._tg.start_soon(self._lease_keeper, keeper)
                    self._tg.start_soon(self._deadline, opts.max_duration.total_seconds())
                    self._tg.start_soon(self._claimer, users_send, started_at)
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(self._writer, updates_recv)
                        async with updates_send, users_recv:
                            for _ in range(opts.concurrency):
                                inner.start_soon(
                                    self._reader, users_recv.clone(), updates_send.clone()
                                )
                    self._tg.cancel_scope.cancel()  # readers and writer are done
            finally:
                # Ended: a stop from now on (SIGTERM while the pass writes its end) has no
                # reader left to cancel, and a task group that is done takes no new task.
                self._tg = None
        await self._finish(started)
        if self._stop_reason == "config" and self._fatal_error is not None:
            raise self._fatal_error
        return self.result

    async def _finish(self, started: float) -> None:
        opts = self.options
        stopped, released = self.breaker.finish(self._stop_reason or "completed")
        with anyio.CancelScope(shield=True):
            for _user, update in released:
                self._pending.append(update)
            await self._flush()
            await self._db(self.store.release, opts.instance)
        if self._lapsed:
            events.lease_lapsed(opts.instance, self._lapsed)
        if stopped == "breaker":
            events.breaker(opts.instance, self.breaker.cause, self.result.counts["rejected"])
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
            while not self._stopping.is_set():
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
                self._leases.claimed((user.id for user in batch), lease_until)
                if not batch:
                    return
                for user in batch:
                    if self._stopping.is_set():
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
                await self._db(self.store.renew_leases, opts.instance, renewal.lease_until)
                self._leases.renewed(renewal, self.clock.now())

    async def _reader(
        self, users: ObjectReceiveStream[UserRow], updates: ObjectSendStream[UserUpdate]
    ) -> None:
        async with users, updates:
            async for user in users:
                if self._stopping.is_set():
                    continue  # claimed but not started: its lease is released at the end
                self._claimed[user.id] = user
                try:
                    update = await self._turn(user)
                except _Interrupted:
                    self._leases.forget(user.id)
                    continue  # stopped while waiting for a permit: the user stays due
                if update is not None:
                    await self._route(user, update, updates)
                else:  # its token went meanwhile: nothing to write
                    self._claimed.pop(user.id, None)
                self._saw_404.discard(user.id)  # routed: a pass keeps nothing per user read
                self.result.users += 1
                if self.on_progress is not None:
                    self.on_progress(self)

    async def _writer(self, updates: ObjectReceiveStream[UserUpdate]) -> None:
        async with updates:
            closed = False
            while not closed:
                with anyio.move_on_after(WRITE_LINGER_S):
                    while len(self._pending) < WRITE_BATCH:
                        try:
                            self._pending.append(await updates.receive())
                        except anyio.EndOfStream:
                            closed = True
                            break
                await self._flush()

    async def _flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        discarded: list[tuple[UserUpdate, str]] = []
        with anyio.CancelScope(shield=True):  # a batch is written whole or not at all
            await self._db(
                partial(
                    self.store.apply,
                    batch,
                    owner=self.options.instance,
                    now=self.clock.now(),
                    discarded=discarded,
                )
            )
        not_written = {id(update): reason for update, reason in discarded}
        for update in batch:  # a pass over a million users keeps only the unwritten rows
            user = self._claimed.pop(update.user_id, None)
            self._leases.forget(update.user_id)
            reason = not_written.get(id(update))
            if reason is not None:
                # `changed`: a lifecycle command (enrollment, drop, forget) or another
                # instance changed the user since the claim, and wins. `failed`: the
                # database refused this user's write alone; it stays due. Neither says more
                # (no payload), nor logs the decision's state or token changes: they did
                # not happen.
                name = user.user if user is not None else str(update.user_id)
                events.discarded(name, reason, update.last_outcome)
            elif user is not None:
                # Only now that the write is committed are its changes true.
                events.changes(user, update)

    # -- one user's turn -----------------------------------------------------------------

    async def _turn(self, user: UserRow) -> UserUpdate | None:
        opts = self.options
        if user.token is None:
            return None
        try:
            token = self.vault.decrypt(user.token, user=user.user)
        except UnknownKeyError as exc:
            self._fatal_error = exc
            self._abort("config")
            return None
        except TokenDecryptError:
            events.undecryptable(user)
            return self._unusable(user)
        # upstream (and httpx with it) is imported at the first read: a `run` with nobody
        # due never needs it.
        from lta_worker.upstream import long_term_credential

        try:
            credential = long_term_credential(token, self.client_secret)
        except ValueError:  # stored before enrollment checked what a header can carry
            events.unsendable(user)
            return self._unusable(user)
        secrets = (token.reveal().encode(), *self._secret_bytes)
        results: list[tuple[Endpoint | None, Outcome]] = []
        for endpoint in endpoints_to_call(user, opts.client_scopes, self.clock.now()):
            if not still_wanted(user, endpoint, results, self.clock.now(), opts.policy):
                continue  # `poll.stats = "on_change"`: latest-change did not move
            try:
                outcome = await self._read(user, endpoint, credential, secrets)
            except _Interrupted:
                if not results:
                    raise
                # Stopped mid-turn: keep what was read, but leave the user due so that the
                # next pass reads the whole turn (nothing read is thrown away).
                now = self.clock.now()
                update = decide_turn(user, results, now, opts.policy, self.rng)
                return replace(update, next_due_at=user.next_due_at or now, due_class=None)
            results.append((endpoint, outcome))
            if ends_turn(outcome):
                break
        return decide_turn(user, results, self.clock.now(), opts.policy, self.rng)

    def _unusable(self, user: UserRow) -> UserUpdate:
        """The turn of a user whose stored token cannot be used: nothing is sent, the
        token is kept, and the user is tried again rarely (`undecryptable`)."""
        unusable = Outcome(kind="undecryptable")
        self.result.counts[unusable.kind] += 1
        return decide_turn(
            user, [(None, unusable)], self.clock.now(), self.options.policy, self.rng
        )

    async def _permit(self) -> Permit:
        """Wait for a pacer permit; raise `_Interrupted` when the pass stops meanwhile."""
        if self._stopping.is_set():
            raise _Interrupted
        permit: Permit | None = None
        with anyio.CancelScope() as scope:
            self._permit_waits.add(scope)
            try:
                permit = await self.pacer.acquire()  # cancelled while waiting: nothing taken
            finally:
                self._permit_waits.discard(scope)
        if scope.cancelled_caught:
            raise _Interrupted
        if permit is None:  # a broken pacer (or wrapper) must fail loudly, not skip users
            raise TypeError("the pacer's acquire() returned no Permit")
        return permit

    async def _read(
        self, user: UserRow, endpoint: Endpoint, credential: Secret, secrets: tuple[bytes, ...]
    ) -> Outcome:
        attempt = 0
        while True:
            attempt += 1
            self._check_lease(user)  # a permit may take long: not waited for in vain
            permit = await self._permit()
            try:
                self._check_lease(user)
            except _LeaseLapsed:
                self.pacer.feed(permit, {}, None)  # taken, not used: the pacer is told
                raise
            begun = self.clock.monotonic()
            try:
                answer = await self.api.read(endpoint, credential)
            except BaseException:
                # Cancelled mid-request (grace over): the permit is used and no answer
                # came. The pacer outlives the pass in `serve`, so it must be told.
                self.pacer.feed(permit, {}, None)
                raise
            outcome = classify(endpoint, answer)
            if outcome.kind == "ok" and echoes(answer.body, outcome.canonical(), secrets):
                outcome = Outcome("transient", status=answer.status, reason="credential echoed")
            if outcome.kind == "rate_limited":
                wait = wait_after_429(answer.headers, self.clock.now(), self.options.max_wait)
                outcome = replace(outcome, wait=wait)
            if answer.status == 404:
                self._saw_404.add(user.id)
            # A plain 401 does not identify the client, so its rate limit headers (if any)
            # describe some other bucket: the pacer only learns that the permit is done.
            headers = answer.headers if outcome.kind != "rejected" else {}
            self.pacer.feed(permit, headers, answer.status, elapsed=answer.elapsed)
            self._count(user, endpoint, outcome, self.clock.monotonic() - begun)
            if not read_again(outcome, attempt):
                return outcome

    def _check_lease(self, user: UserRow) -> None:
        """Raise `_LeaseLapsed` unless a read sent now ends while `user`'s lease is held."""
        if not self._leases.may_read(user.id, self.clock.now(), self._read_margin):
            self._lapsed += 1
            raise _LeaseLapsed

    def _count(self, user: UserRow, endpoint: Endpoint, outcome: Outcome, took: float) -> None:
        self.result.reads += 1
        self.result.counts[outcome.kind] += 1
        if self.on_read is not None:
            self.on_read(endpoint, outcome.kind, took)
        if outcome.kind == "rate_limited":
            self.result.throttled += 1
        events.read(self._read_log, user, endpoint, outcome, took, budget=self.pacer.snapshot())
        signal = self.breaker.observe(outcome)
        if signal == "trip":
            self._abort("breaker")
        elif signal == "down":
            self.request_stop("upstream_down", self.options.grace.total_seconds())

    async def _route(
        self, user: UserRow, update: UserUpdate, updates: ObjectSendStream[UserUpdate]
    ) -> None:
        """Send a decision to the writer, unless the breaker holds it for now."""
        routed = self.breaker.route(
            (user, update),
            saw_404=user.id in self._saw_404,
            rejected=update.last_outcome == "rejected",
        )
        if routed.trip:
            self._abort("breaker")
        for _held_user, held_update in routed.release:
            await updates.send(held_update)

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store call, on a worker thread: it may wait for the database (see the module)."""
        return await anyio.to_thread.run_sync(partial(fn, *args))
