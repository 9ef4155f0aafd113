"""One user's turn in a pass (decrypt, read each endpoint, classify, decide), and the log
lines of a read and of a decision written (docs/log-events.md). A read is sent only while
the user's lease is certainly held until its end (`LeaseBook`), else the turn is given up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio

from lta_worker.domain import (
    Breaker,
    Endpoint,
    Outcome,
    Proof,
    UserRow,
    UserUpdate,
    classify,
    decide_turn,
    endpoints_to_call,
    ends_turn,
    read_again,
    still_wanted,
)
from lta_worker.errors import UnknownKeyError
from lta_worker.logs import get_logger
from lta_worker.pacing import PacerLike, PacerSnapshot, wait_after_429
from lta_worker.runtime import Clock
from lta_worker.secret import Secret
from lta_worker.storage import TokenDecryptError
from lta_worker.worker._pass import (
    Interrupted,
    LeaseBook,
    LeaseLapsed,
    PassOptions,
    PassResult,
    PassStop,
    Reader,
    ReadObserver,
    lease_of,
)

if TYPE_CHECKING:
    from lta_worker.storage import Vault

log = get_logger("lta_worker.engine")


def pass_logger() -> Any:
    """The logger of one pass's `poll.read` lines, bound once (`log` binds at every line)."""
    return log.bind()


def log_read(
    per_pass: Any,
    user: UserRow,
    endpoint: Endpoint,
    outcome: Outcome,
    took: float,
    *,
    budget: PacerSnapshot,
) -> None:
    """`poll.read` (through `per_pass`, `pass_logger`), and `ratelimit.throttled` after a 429."""
    per_pass.info(
        "poll.read",
        user=user.user,
        endpoint=endpoint,
        status=outcome.status,
        outcome=outcome.kind,
        code=outcome.code,
        reason=outcome.reason,
        duration_ms=round(took * 1000, 1),
        budget_remaining=budget.remaining,
        budget_limit=budget.limit,
        budget_reset_s=None if budget.reset_in is None else round(budget.reset_in, 1),
    )
    if outcome.kind == "rate_limited":
        log.warning(
            "ratelimit.throttled", user=user.user, endpoint=endpoint, retry_after_s=outcome.wait
        )


def log_changes(user: UserRow, update: UserUpdate) -> None:
    """`user.state_changed`, `token.deleted` and `endpoint.denied` for a decision written."""
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


@dataclass(kw_only=True)
class Turns:
    """The turns of one pass's users, over the pass's collaborators and its result."""

    vault: Vault
    api: Reader
    pacer: PacerLike
    clock: Clock
    options: PassOptions
    rng: random.Random
    stop: PassStop
    leases: LeaseBook
    breaker: Breaker[tuple[UserRow, UserUpdate]]
    result: PassResult
    read_margin: timedelta
    on_read: ReadObserver | None = None
    saw_404: set[int] = field(default_factory=set)  # users that met a 404 (the breaker)
    lapsed: int = 0  # users whose turn was given up for their lease (`LeaseLapsed`)
    fatal_error: UnknownKeyError | None = None  # what aborted the pass, if anything
    _proving: dict[Proof, anyio.Event] = field(default_factory=dict)  # proofs being asked
    _read_log: Any = field(default_factory=pass_logger)  # one per pass

    async def turn(self, user: UserRow) -> UserUpdate | None:
        """The user's decision, or None (no token, or an abort); `Interrupted` before a read."""
        opts = self.options
        if user.token is None:
            return None
        try:
            token = self.vault.decrypt(user.token, user=user.user)
        except UnknownKeyError as exc:
            self.fatal_error = exc
            self.stop.abort("config")
            return None
        except TokenDecryptError:
            key_id = None if user.token is None else user.token.key_id
            log.error("token.undecryptable", user=user.user, key_id=key_id)
            return self._unusable(user)
        from lta_worker.upstream import usable_token  # httpx only when someone is due

        if not usable_token(token):  # stored before enrollment checked what a header can carry
            log.error(
                "token.unsendable",
                user=user.user,
                hint="the token holds a space, a control character or a character beyond ASCII "
                "(stored before enrollment refused such tokens); enroll the user again",
            )
            return self._unusable(user)
        results: list[tuple[Endpoint | None, Outcome]] = []
        for endpoint in endpoints_to_call(user, opts.client_scopes, self.clock.now()):
            if not still_wanted(user, endpoint, results, self.clock.now(), opts.policy):
                continue  # `poll.stats = "on_change"`: latest-change did not move
            try:
                outcome = await self._read(user, endpoint, token, first=not results)
            except Interrupted:
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
        """An unusable stored token: nothing sent, token kept, retried rarely (`undecryptable`)."""
        unusable = Outcome(kind="undecryptable")
        self.result.counts[unusable.kind] += 1
        self.result.users += 1
        return decide_turn(
            user, [(None, unusable)], self.clock.now(), self.options.policy, self.rng
        )

    async def _read(
        self, user: UserRow, endpoint: Endpoint, token: Secret, *, first: bool
    ) -> Outcome:
        attempt = 0
        while True:
            attempt += 1
            self._check_lease(user)  # a permit may take long: not waited for in vain
            permit = await self.stop.permit(self.pacer)
            try:
                self._check_lease(user)
            except LeaseLapsed:
                self.pacer.feed(permit, {}, None)  # taken, not used: the pacer is told
                raise
            # Counted as its first read goes out: a pass cut short still counts it.
            if first and attempt == 1:
                self.result.users += 1
            begun = self.clock.monotonic()
            try:
                answer = await self.api.read(endpoint, token)
            except BaseException:
                # Cancelled mid-request: the pacer (which outlives the pass) must be told.
                self.pacer.feed(permit, {}, None)
                raise
            read_at = self.clock.now()
            outcome = replace(classify(endpoint, answer), at=read_at)
            if outcome.kind == "rate_limited":
                wait = wait_after_429(answer.headers, read_at, self.options.max_wait)
                outcome = replace(outcome, wait=wait)
            if answer.status == 404:
                self.saw_404.add(user.id)
            # A plain 401 does not identify the client, so its rate limit headers (if any)
            # describe some other bucket: the pacer only learns that the permit is done.
            headers = answer.headers if outcome.kind != "rejected" else {}
            self.pacer.feed(permit, headers, answer.status, elapsed=answer.elapsed)
            if self._count(user, endpoint, outcome, self.clock.monotonic() - begun):
                await self.prove("urls")
            if not read_again(outcome, attempt):
                return outcome

    def _check_lease(self, user: UserRow) -> None:
        """Raise `LeaseLapsed` unless a read sent now ends while `user`'s lease is held."""
        if not self.leases.may_read(lease_of(user), self.clock.now(), self.read_margin):
            self.lapsed += 1
            raise LeaseLapsed

    async def prove(self, proof: Proof) -> None:
        """Ask `proof` once a pass and tell the breaker; a reader needing it meanwhile waits."""
        while proof in self._proving:
            await self._proving[proof].wait()
        if proof in self.breaker.proofs:
            return
        self._proving[proof] = asked = anyio.Event()
        try:
            if self.breaker.prove(proof, await self.api.prove(proof)):
                self.stop.abort("breaker")
        finally:  # answered or cancelled: a later need asks again if it is not recorded
            del self._proving[proof]
            asked.set()

    def _count(self, user: UserRow, endpoint: Endpoint, outcome: Outcome, took: float) -> bool:
        """Count and log one read; True when the breaker asks for the `urls` proof."""
        self.result.reads += 1
        self.result.counts[outcome.kind] += 1
        if self.on_read is not None:
            self.on_read(endpoint, outcome.kind, took)
        if outcome.kind == "rate_limited":
            self.result.throttled += 1
        log_read(self._read_log, user, endpoint, outcome, took, budget=self.pacer.snapshot())
        signal = self.breaker.observe(outcome, user.id)
        if signal == "trip":
            self.stop.abort("breaker")
        elif signal == "down":
            self.stop.request("upstream_down", self.options.grace.total_seconds())
        return signal == "check"
