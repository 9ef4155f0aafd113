"""Ending a user's access on the client's side: drop (token gone) and forget (results gone too).

A drop has two phases (DESIGN.md, state `dropping`):

1. The user is marked `dropping` and its generation bumped, in one transaction: from then
   on no pass reads with its token, and a decision a running pass makes about it is
   discarded (`poll.discarded`). Lifecycle commands always win.
2. The DELETE is sent with the user's credential. When the service confirms it
   (`policy.drop_verdict`), the token is deleted and the user is `dropped`. When it does
   not (unreachable, 5xx, a plain 401), the token is kept only to send the DELETE again:
   the user stays `dropping`, due for a retry with backoff, and `run` / `serve` retry it
   (`retry_pending`) within the budget until it is confirmed.

A user with no token (revoked or already dropped) is left exactly as it is. `forget` also
purges every stored result of the user (snapshots and history) at once, right after phase
1, whatever happens to the DELETE: what the client does when one of its users deletes their
account (spec section 5, rule 7).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from anyio import to_thread

from lta_worker.domain import PolicyConfig, drop_retry_at, drop_verdict, find_code
from lta_worker.enrollment._base import ClientOperation
from lta_worker.errors import UnknownUserError
from lta_worker.logs import get_logger, register_secret
from lta_worker.storage import TokenDecryptError
from lta_worker.upstream import long_term_credential

if TYPE_CHECKING:
    from lta_worker.domain import UserRow
    from lta_worker.pacing import PacerLike

UpstreamResult = Literal["ok", "failed", "refused", "skipped"]
DROP_BATCH = 20


def _log() -> Any:
    # Looked up per event, not bound at import: a logger bound before `configure_logging`
    # would keep structlog's default configuration.
    return get_logger("lta_worker.lifecycle")


@dataclass(frozen=True, slots=True)
class DropResult:
    """What a drop or forget did.

    Attributes:
        user: the client's user id.
        upstream: `ok` (the service confirmed the DELETE), `failed` (unreachable or an
            unexpected answer: the drop will be retried), `refused` (a plain 401: the
            credential was not accepted; retried too), or `skipped` (no token was held).
        status: the service's HTTP status, when it answered.
        error: why the upstream call failed, in words (never a secret).
        previous_state: the user's state before.
        state: the user's state after (`dropped`, `dropping`, or unchanged when skipped).
        retry_at: when `run` / `serve` send the DELETE again, for a pending drop.
        purged: how many stored results (snapshots and history rows) `forget` removed;
            None for a plain drop.
    """

    user: str
    upstream: UpstreamResult
    status: int | None
    error: str | None
    previous_state: str
    state: str = "dropped"
    retry_at: datetime | None = None
    purged: int | None = None


@dataclass(slots=True)
class DropRetries:
    """What `retry_pending` did: drops confirmed, still pending, and given back (stopped)."""

    confirmed: int = 0
    pending: int = 0
    interrupted: int = 0
    users: list[str] = field(default_factory=list)


class Lifecycle(ClientOperation):
    """Drops and forgets users, and retries the drops the service did not confirm.

    Args:
        settings: for the client secret file and the retry backoff.
        store: users, tokens and results.
        vault: decrypts the token to build the credential for the DELETE.
        api: the service's HTTP interface.
        clock: returns the current aware UTC datetime (`SystemClock().now`, a test clock's
            `now`); the system clock by default.
        client_secret: the client secret (default: read from `client.secret_file` when needed).
    """

    rng: random.Random = random.Random()

    async def drop(self, user: str) -> DropResult:
        """Mark the user `dropping`, DELETE the token upstream, and on confirmation drop it.

        Raises:
            UnknownUserError: no such user (exit 2).
            ConfigError: the stored token cannot be decrypted, or `client.secret_file`
                cannot be used (nothing is changed).
        """
        result = await self._drop(user, reason="dropped", purge=False)
        _dropped_event(result)
        return result

    async def forget(self, user: str) -> DropResult:
        """Drop the user and purge every stored result of theirs (snapshots and history).

        The results are purged right after the user is marked `dropping` (so no pass can
        write any back), before the DELETE, whatever its answer.

        Raises:
            UnknownUserError: no such user (exit 2).
            ConfigError: as `drop` (nothing is changed, no result purged).
        """
        result = await self._drop(user, reason="forgotten", purge=True)
        _dropped_event(result)
        return result

    async def _drop(self, user: str, *, reason: str, purge: bool) -> DropResult:
        row = await to_thread.run_sync(self._store.get_user, user)
        if row is None:
            raise UnknownUserError(user)
        if row.token is not None:  # a key or secret file problem: found before any change
            register_secret(self._vault.decrypt(row.token, user=user))
            _ = self.client_secret
        start = await to_thread.run_sync(self._store.begin_drop, user, self._clock())
        purged: int | None = None
        if purge:
            purged = await to_thread.run_sync(self._store.purge_results, user)
        before, after = start.before, start.after
        if after.state != "dropping":
            return DropResult(
                user=user,
                upstream="skipped",
                status=None,
                error=None,
                previous_state=before.state,
                state=after.state,
                purged=purged,
            )
        if before.state != "dropping":
            _log().info(
                "user.state_changed",
                user=user,
                **{"from": before.state},
                to="dropping",
                reason=reason,
            )
        outcome = await self._send_drop(after, reason=reason)
        return DropResult(
            user=user,
            upstream=outcome.upstream,
            status=outcome.status,
            error=outcome.error,
            previous_state=before.state,
            state=outcome.state,
            retry_at=outcome.retry_at,
            purged=purged,
        )

    async def _send_drop(self, row: UserRow, *, reason: str) -> DropResult:
        """Send the DELETE of a `dropping` user and record what the answer means."""
        assert row.token is not None  # a dropping user holds its token until confirmed
        status: int | None = None
        code: str | None = None
        try:
            token = self._vault.decrypt(row.token, user=row.user)
            register_secret(token)
            answer = await self._api.drop(long_term_credential(token, self.client_secret))
        except ValueError:
            error: str | None = "the stored token is not a long term token"
        else:
            status = answer.status
            if status is None:
                error = f"could not reach the service ({answer.error or 'network error'})"
            else:
                code = find_code(answer.headers, answer.body)[0]
                error = None if 200 <= status < 300 else f"the service answered HTTP {status}"
        verdict = drop_verdict(status, code)
        now = self._clock()
        if verdict == "confirmed":
            if await to_thread.run_sync(self._store.finish_drop, row.id, row.generation, now):
                _log().warning("token.deleted", user=row.user, reason=reason)
                _log().info(
                    "user.state_changed",
                    user=row.user,
                    **{"from": "dropping"},
                    to="dropped",
                    reason=reason,
                )
                _log().info("drop.confirmed", user=row.user, status=status, code=code)
                state = "dropped"
            else:  # re-enrolled (or dropped by another command) meanwhile: its row now
                current = await to_thread.run_sync(self._store.get_user, row.user)
                state = current.state if current is not None else "dropped"
            return DropResult(row.user, "ok", status, None, "dropping", state=state)
        upstream: UpstreamResult = "refused" if verdict == "refused" else "failed"
        if verdict == "refused":
            error = (
                "the service refused the credential (HTTP 401): check client.secret_file; "
                "the token may still be live upstream"
            )
        retry_at = drop_retry_at(row.consecutive_failures + 1, now, self._policy(), self.rng)
        await to_thread.run_sync(
            partial(
                self._store.defer_drop,
                row.id,
                row.generation,
                retry_at=retry_at,
                reason=f"drop_{upstream}",
            )
        )
        _log().warning(
            "drop.pending",
            user=row.user,
            upstream=upstream,
            status=status,
            error=error,
            retry_at=retry_at,
        )
        return DropResult(
            row.user, upstream, status, error, "dropping", state="dropping", retry_at=retry_at
        )

    def _policy(self) -> PolicyConfig:
        return PolicyConfig.from_settings(self._settings.poll)

    async def retry_pending(
        self,
        pacer: PacerLike,
        *,
        owner: str,
        lease: timedelta,
        stopping: Any = None,
    ) -> DropRetries:
        """Send again the DELETE of every `dropping` user due for a retry, through the pacer.

        Each DELETE waits for a pacer permit (it spends the same budget as the reads).
        `stopping`, when given, is a callable returning True once the caller stops: the
        users not yet sent stay due (their leases are released).
        """
        done = DropRetries()
        given_back: list[int] = []
        while not (stopping is not None and stopping()):
            now = self._clock()
            batch: list[UserRow] = await to_thread.run_sync(
                partial(
                    self._store.claim_drops,
                    now=now,
                    limit=DROP_BATCH,
                    owner=owner,
                    lease_until=now + lease,
                )
            )
            if not batch:
                break
            for row in batch:
                if stopping is not None and stopping():
                    done.interrupted += 1
                    given_back.append(row.id)
                    continue
                permit = await pacer.acquire()
                _log().info("drop.retried", user=row.user, attempt=row.consecutive_failures + 1)
                try:
                    result = await self._send_drop(row, reason="dropped")
                except TokenDecryptError:
                    # A tampered or copied row: nothing can be sent for it. It stays
                    # `dropping` (never read) and is tried again a parked interval later.
                    pacer.feed(permit, {}, None)  # the permit is given back unused
                    _log().error(
                        "token.undecryptable",
                        user=row.user,
                        key_id=row.token.key_id if row.token else None,
                    )
                    retry_at = self._clock() + self._settings.poll.parked_interval
                    await to_thread.run_sync(
                        partial(
                            self._store.defer_drop,
                            row.id,
                            row.generation,
                            retry_at=retry_at,
                            reason="undecryptable",
                        )
                    )
                    done.pending += 1
                    continue
                pacer.feed(permit, {}, result.status)
                done.users.append(row.user)
                if result.upstream == "ok":
                    done.confirmed += 1
                else:
                    done.pending += 1
        if given_back:
            await to_thread.run_sync(self._store.release, owner, given_back)
        return done


def _dropped_event(result: DropResult) -> None:
    _log().info(
        "user.dropped",
        user=result.user,
        upstream=result.upstream,
        status=result.status,
        error=result.error,
        state=result.state,
        purged=result.purged is not None,
        purged_rows=result.purged,
    )
