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
  decide. Decisions go to the single writer, which commits in small batches.
- Circuit breaker: plain 401s with no authenticated answer in the pass are held back; when
  `poll.breaker_threshold` of them accumulate, or the pass ends with only such answers, the
  held decisions are dropped (no user changes state or schedule) and the pass ends with
  exit 78.
- Wrong URL: a 404 is an answer only latest-change may give (nothing recorded). While no
  answer of the pass proves the URLs right (a 2xx, or a 401/403, which shows the endpoint
  exists), decisions of turns that saw a 404 are held back the same way; at
  `poll.breaker_threshold` of them, or at a pass end with nothing else, they are dropped
  and the pass ends with exit 78 and a hint naming `service.base_url`.
- Fencing: every decision carries the generation its user was claimed with, and the store
  writes it only while the row still has it (a lifecycle command changed nothing since);
  otherwise it is discarded with a `poll.discarded` event. So are the decisions of users
  whose write failed (the others of the batch are written; the user stays due).
- The pass ends when no due user is left (0), at the deadline or when the service seems
  down, or no read got any answer at all (75: the rest stays due), or at the breaker (78).
- A stop (deadline, SIGTERM in `serve`) lets reads already sent finish; a reader still
  waiting for a pacer permit gives its turn up at once, so a tight budget never holds a
  stop for the whole grace period. The user stays due; what its turn read before the stop
  is kept.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream, TaskGroup

from lta_worker.domain import (
    OUTCOME_KINDS,
    Answer,
    Endpoint,
    Outcome,
    PolicyConfig,
    UserRow,
    UserUpdate,
    classify,
    decide_turn,
    endpoints_to_call,
    ends_turn,
    still_wanted,
)
from lta_worker.errors import EX_CONFIG, EX_OK, EX_TEMPFAIL, UnknownKeyError
from lta_worker.logs import get_logger
from lta_worker.pacing import DEFAULT_MAX_WAIT, PacerLike, wait_after_429
from lta_worker.secret import Secret
from lta_worker.upstream import long_term_credential
from lta_worker.worker._clock import Clock

if TYPE_CHECKING:
    from lta_worker.storage import Store, Vault

StopReason = Literal["completed", "deadline", "breaker", "upstream_down", "cancelled", "config"]
EXIT_CODES: Final[dict[str, int]] = {
    "completed": EX_OK,
    "deadline": EX_TEMPFAIL,
    "upstream_down": EX_TEMPFAIL,
    "cancelled": EX_TEMPFAIL,
    "breaker": EX_CONFIG,
    "config": EX_CONFIG,
}
# Answers that prove the client itself is accepted (both halves of the credential right).
AUTHENTICATED: Final = frozenset({"ok", "none", "revoked", "unlinked", "inactive", "scope_denied"})
RATE_LIMIT_ATTEMPTS: Final = 3
WRITE_BATCH: Final = 50
WRITE_LINGER_S: Final = 0.5

log = get_logger("lta_worker.engine")


class _Interrupted(Exception):
    """A turn given up because the pass stopped while it waited for a permit."""


class Reader(Protocol):
    """What the engine needs of the API client."""

    async def read(self, endpoint: Endpoint, credential: Secret) -> Answer:
        """One read with the long term credential; never raises for HTTP or network trouble."""
        ...


@dataclass(frozen=True, slots=True)
class PassOptions:
    """How one pass runs; built from settings by `options_from_settings`."""

    instance: str
    client_scopes: tuple[str, ...]
    policy: PolicyConfig
    max_duration: timedelta
    concurrency: int = 8
    batch_size: int = 100
    lease_duration: timedelta = timedelta(minutes=5)
    breaker_threshold: int = 5
    upstream_down_after: int = 20
    grace: timedelta = timedelta(seconds=10)
    max_wait: float = DEFAULT_MAX_WAIT


@dataclass(slots=True)
class PassResult:
    """How a pass ended and what it did."""

    stopped: StopReason
    exit_code: int
    users: int = 0
    reads: int = 0
    throttled: int = 0
    wall_s: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        """The fields of the `pass.finished` event."""
        counts: dict[str, int] = {kind: self.counts.get(kind, 0) for kind in OUTCOME_KINDS}
        return {
            "stopped": self.stopped,
            "exit_code": self.exit_code,
            "users": self.users,
            "reads": self.reads,
            "throttled": self.throttled,
            "wall_s": round(self.wall_s, 3),
            **counts,
        }


ProgressFn = Callable[["PassEngine"], None]


class PassEngine:
    """Runs one pass. Collaborators are injected (STYLE 4): tests plug in the simulator."""

    def __init__(
        self,
        *,
        store: Store,
        vault: Vault,
        api: Reader,
        pacer: PacerLike,
        clock: Clock,
        client_secret: Secret,
        options: PassOptions,
        rng: random.Random | None = None,
        on_progress: ProgressFn | None = None,
    ) -> None:
        self.store = store
        self.vault = vault
        self.api = api
        self.pacer = pacer
        self.clock = clock
        self.client_secret = client_secret
        self.options = options
        self.rng = rng or random.Random()
        self.on_progress = on_progress
        self.result = PassResult(stopped="completed", exit_code=EX_OK)
        self.due_at_start = 0
        self._stopping = anyio.Event()
        self._stop_reason: StopReason | None = None
        self._fatal_error: Exception | None = None
        self._scope: anyio.CancelScope | None = None
        self._permit_waits: set[anyio.CancelScope] = set()
        self._tg: TaskGroup | None = None
        self._authenticated = 0
        self._held_rejected: list[tuple[UserRow, UserUpdate]] = []
        self._held_404: list[tuple[UserRow, UserUpdate]] = []
        self._saw_404: set[int] = set()
        self._url_proven = False
        self._answered = 0
        self._answers_404 = 0
        self._breaker_cause = "plain_401"
        self._names: dict[int, str] = {}
        self._pending: list[UserUpdate] = []
        self._consecutive_transient = 0

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
        await anyio.sleep(grace)
        if self._scope is not None:
            self._scope.cancel()

    async def _deadline(self, seconds: float) -> None:
        await anyio.sleep(seconds)
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
        log.info(
            "pass.started",
            instance=opts.instance,
            due=self.due_at_start,
            deadline_s=opts.max_duration.total_seconds(),
            concurrency=opts.concurrency,
        )
        users_send, users_recv = anyio.create_memory_object_stream[UserRow](opts.concurrency)
        updates_send, updates_recv = anyio.create_memory_object_stream[UserUpdate](WRITE_BATCH)
        with anyio.CancelScope() as self._scope:
            async with anyio.create_task_group() as self._tg:
                keeper = anyio.CancelScope()
                self._tg.start_soon(self._lease_keeper, keeper)
                self._tg.start_soon(self._deadline, opts.max_duration.total_seconds())
                self._tg.start_soon(self._claimer, users_send, started_at)
                async with anyio.create_task_group() as inner:
                    inner.start_soon(self._writer, updates_recv)
                    async with updates_send, users_recv:
                        for _ in range(opts.concurrency):
                            inner.start_soon(self._reader, users_recv.clone(), updates_send.clone())
                self._tg.cancel_scope.cancel()  # readers and writer are done
        await self._finish(started)
        if self._stop_reason == "config" and self._fatal_error is not None:
            raise self._fatal_error
        return self.result

    async def _finish(self, started: float) -> None:
        opts = self.options
        stopped: StopReason = self._stop_reason or "completed"
        if stopped == "completed" and self._held_404 and not self._url_proven:
            # Fewer users than the threshold, and every answer a 404: nothing proves the
            # URLs right, so this pass changes nobody (a wrong base URL would store `none`).
            stopped, self._breaker_cause = "breaker", "http_404"
        elif stopped == "completed" and self._held_rejected and self._authenticated == 0:
            # Fewer users than the threshold, and every answer a plain 401: the spec's action
            # for a plain 401 is "check configuration", so this pass changes nobody either.
            stopped = "breaker"
        elif stopped == "completed" and self.result.reads and not self._answered:
            # Every read a network failure: the service is unreachable, whatever the number
            # of users (fewer than the threshold never trip the early stop).
            stopped = "upstream_down"
        with anyio.CancelScope(shield=True):
            if stopped not in {"breaker", "config"}:
                # A 404 decision is written only once an answer proved the URLs right,
                # whatever else stopped the pass (a wrong URL must never store `none`).
                proven = self._held_404 if self._url_proven else []
                for user, update in [*self._held_rejected, *proven]:
                    self._log_changes(user, update)
                    self._pending.append(update)
            self._held_rejected.clear()
            self._held_404.clear()
            await self._flush()
            await self._db(self.store.release, opts.instance)
        if stopped == "breaker":
            self._log_breaker()
        if stopped == "upstream_down" and not self._answered:
            log.error(
                "pass.unreachable",
                instance=opts.instance,
                reads=self.result.reads,
                hint="no read got any answer (network failures only): the service is "
                "unreachable from here, or service.base_url names the wrong host; every "
                "user stays due",
            )
        self.result.stopped = stopped
        self.result.exit_code = EXIT_CODES[stopped]
        self.result.wall_s = self.clock.monotonic() - started
        log.info("pass.finished", instance=opts.instance, **self.result.summary())

    def _log_breaker(self) -> None:
        if self._breaker_cause == "http_404":
            log.error(
                "pass.breaker_tripped",
                instance=self.options.instance,
                cause="http_404",
                rejected=self.result.counts.get("rejected", 0),
                hint="every answer was a 404 and none proved the URLs right: "
                "service.base_url (or its path prefix) is likely wrong; no user was changed",
            )
            return
        log.error(
            "pass.breaker_tripped",
            instance=self.options.instance,
            cause="plain_401",
            rejected=self.result.counts.get("rejected", 0),
            hint="every answer was a plain 401 and none was accepted: the client secret "
            "(client.secret_file) or the client configuration is likely wrong; no user "
            "was changed",
        )

    # -- tasks ---------------------------------------------------------------------------

    async def _claimer(self, send: ObjectSendStream[UserRow], due_before: datetime) -> None:
        opts = self.options
        async with send:
            while not self._stopping.is_set():
                now = self.clock.now()
                batch: Sequence[UserRow] = await self._db(
                    partial(
                        self.store.claim_due,
                        now=now,
                        due_before=due_before,
                        limit=opts.batch_size,
                        owner=opts.instance,
                        lease_until=now + opts.lease_duration,
                    )
                )
                if not batch:
                    return
                for user in batch:
                    if self._stopping.is_set():
                        return
                    await send.send(user)

    async def _lease_keeper(self, scope: anyio.CancelScope) -> None:
        opts = self.options
        period = max(opts.lease_duration.total_seconds() / 3, 0.05)
        with scope:
            while True:
                await anyio.sleep(period)
                lease_until = self.clock.now() + opts.lease_duration
                await self._db(self.store.renew_leases, opts.instance, lease_until)

    async def _reader(
        self, users: ObjectReceiveStream[UserRow], updates: ObjectSendStream[UserUpdate]
    ) -> None:
        async with users, updates:
            async for user in users:
                if self._stopping.is_set():
                    continue  # claimed but not started: its lease is released at the end
                self._names[user.id] = user.user
                try:
                    update = await self._turn(user)
                except _Interrupted:
                    continue  # stopped while waiting for a permit: the user stays due
                if update is not None:
                    await self._route(user, update, updates)
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
                partial(self.store.apply, batch, owner=self.options.instance, discarded=discarded)
            )
        for update, reason in discarded:
            # `changed`: a lifecycle command (enrollment, drop, forget) or another instance
            # changed the user since the claim, and wins. `failed`: the database refused
            # this user's write alone; it stays due. Neither says more (no payload).
            log.warning(
                "poll.discarded",
                user=self._names.get(update.user_id, str(update.user_id)),
                reason=reason,
                outcome=update.last_outcome,
            )
        for update in batch:  # a pass over a million users keeps only the unwritten names
            self._names.pop(update.user_id, None)

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
        except Exception:
            log.error("token.undecryptable", user=user.user, key_id=user.token.key_id)
            return UserUpdate(
                user_id=user.id,
                state=user.state,
                next_due_at=self.clock.now() + opts.policy.parked_interval,
                consecutive_failures=user.consecutive_failures,
                last_outcome="undecryptable",
                last_polled_at=user.last_polled_at,
                denied=dict(user.denied),
                generation=user.generation,
            )
        credential = long_term_credential(token, self.client_secret)
        results: list[tuple[Endpoint, Outcome]] = []
        for endpoint in endpoints_to_call(user, opts.client_scopes, self.clock.now()):
            if not still_wanted(user, endpoint, results, self.clock.now(), opts.policy):
                continue  # `poll.stats = "on_change"`: latest-change did not move
            try:
                outcome = await self._read(user, endpoint, credential)
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

    async def _permit(self) -> None:
        """Wait for a pacer permit; raise `_Interrupted` when the pass stops meanwhile."""
        if self._stopping.is_set():
            raise _Interrupted
        with anyio.CancelScope() as scope:
            self._permit_waits.add(scope)
            try:
                await self.pacer.acquire()  # cancelled while waiting, it accounts nothing
            finally:
                self._permit_waits.discard(scope)
        if scope.cancelled_caught:
            raise _Interrupted

    async def _read(self, user: UserRow, endpoint: Endpoint, credential: Secret) -> Outcome:
        outcome = Outcome(kind="transient", reason="not attempted")
        for _ in range(RATE_LIMIT_ATTEMPTS):
            await self._permit()
            begun = self.clock.monotonic()
            try:
                answer = await self.api.read(endpoint, credential)
            except BaseException:
                # Cancelled mid-request (grace over): the permit is used and no answer
                # came. The pacer outlives the pass in `serve`, so it must be told.
                self.pacer.feed({}, None)
                raise
            outcome = classify(endpoint, answer)
            if outcome.kind == "rate_limited":
                wait = wait_after_429(answer.headers, self.clock.now(), self.options.max_wait)
                outcome = replace(outcome, wait=wait)
            if answer.status is not None:
                self._answered += 1
                if answer.status == 404:
                    self._saw_404.add(user.id)
                    self._answers_404 += 1
                    if not self._url_proven and self._answers_404 >= self.options.breaker_threshold:
                        # As many 404s as the pacer's first burst and nothing else: stop
                        # before waiting out the slow fallback rate for more of the same.
                        self._breaker_cause = "http_404"
                        self._abort("breaker")
                elif 200 <= answer.status < 300 or answer.status in (401, 403):
                    self._url_proven = True  # the endpoint exists at this URL
            # A plain 401 does not identify the client, so its rate limit headers (if any)
            # describe some other bucket: the pacer only learns that the permit is done.
            headers = answer.headers if outcome.kind != "rejected" else {}
            self.pacer.feed(headers, answer.status, elapsed=answer.elapsed)
            self._count(user, endpoint, outcome, self.clock.monotonic() - begun)
            if outcome.kind != "rate_limited":
                break
        return outcome

    def _count(self, user: UserRow, endpoint: Endpoint, outcome: Outcome, took: float) -> None:
        self.result.reads += 1
        self.result.counts[outcome.kind] += 1
        budget = self.pacer.snapshot()
        log.info(
            "poll.read",
            user=user.user,
            endpoint=endpoint,
            status=outcome.status,
            outcome=outcome.kind,
            code=outcome.code,
            reason=outcome.reason,
            duration_ms=round(took * 1000, 1),
            budget_remaining=getattr(budget, "remaining", None),
            budget_limit=getattr(budget, "limit", None),
            budget_reset_s=_rounded(getattr(budget, "reset_in", None)),
        )
        if outcome.kind == "rate_limited":
            self.result.throttled += 1
            log.warning(
                "ratelimit.throttled", user=user.user, endpoint=endpoint, retry_after_s=outcome.wait
            )
        if outcome.kind in AUTHENTICATED and outcome.status != 404:
            # A 404 proves nothing of the credential: a wrong URL answers it unauthenticated.
            self._authenticated += 1
        if outcome.kind == "transient" and outcome.status != 404:
            self._consecutive_transient += 1
            # Before any accepted answer, as many failures as the pacer's first burst say
            # the service is down (a cron run would otherwise wait out the slow fallback
            # rate); once it has answered, a longer run of failures is needed.
            limit = (
                self.options.upstream_down_after
                if self._authenticated
                else self.options.breaker_threshold
            )
            if self._consecutive_transient >= limit:
                self.request_stop("upstream_down", self.options.grace.total_seconds())
        elif outcome.kind != "rate_limited":
            self._consecutive_transient = 0

    async def _route(
        self, user: UserRow, update: UserUpdate, updates: ObjectSendStream[UserUpdate]
    ) -> None:
        """Send a decision to the writer, holding it while a breaker may trip.

        Held: plain-401 decisions before any authenticated answer, and decisions of turns
        that saw a 404 before any answer proved the URLs right.
        """
        if user.id in self._saw_404 and not self._url_proven:
            self._held_404.append((user, update))
            return
        if update.last_outcome == "rejected" and self._authenticated == 0:
            self._held_rejected.append((user, update))
            if len(self._held_rejected) >= self.options.breaker_threshold:
                self._abort("breaker")
            return
        released: list[tuple[UserRow, UserUpdate]] = []
        if self._held_rejected:  # an answer other than a plain 401 came (as before)
            released, self._held_rejected = self._held_rejected, []
        if self._held_404 and self._url_proven:
            released, self._held_404 = [*released, *self._held_404], []
        for held_user, held_update in released:
            self._log_changes(held_user, held_update)
            await updates.send(held_update)
        self._log_changes(user, update)
        await updates.send(update)

    def _log_changes(self, user: UserRow, update: UserUpdate) -> None:
        if update.state != user.state:
            level = "warning" if update.state in {"revoked", "rejected"} else "info"
            getattr(log, level)(
                "user.state_changed",
                user=user.user,
                **{"from": user.state, "to": update.state},
                reason=update.last_outcome,
            )
        if update.delete_token:
            log.warning("token.deleted", user=user.user, reason=update.state)
        for endpoint, until in update.denied.items():
            if endpoint not in user.denied:
                log.warning("endpoint.denied", user=user.user, endpoint=endpoint, retry_at=until)

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(partial(fn, *args))


def _rounded(seconds: float | None) -> float | None:
    """Seconds to one decimal for a log field (None stays None)."""
    return None if seconds is None else round(seconds, 1)
