"""Drop (token gone) and forget (results gone too), in two phases (docs/operations.md,
"Dropping and forgetting users"). The spec's DELETE answers 204 "whether or not the token
existed": a read with the credential first decides whether a 204 proves anything.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from anyio import CancelScope, to_thread

from lta_worker.domain import (
    ENDPOINTS,
    authenticated,
    classify,
    drop_retry_at,
    drop_verdict,
    find_code,
)
from lta_worker.enrollment._enroll import ClientOperation
from lta_worker.errors import UnknownUserError
from lta_worker.logs import get_logger, register_secret
from lta_worker.storage import TokenDecryptError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from lta_worker.config import PollSettings
    from lta_worker.domain import Answer, UserRow
    from lta_worker.pacing import PacerLike
    from lta_worker.storage import Store, Vault
    from lta_worker.upstream import ApiClient

UpstreamResult = Literal["ok", "failed", "refused", "skipped", "in_flight"]
DROP_BATCH = 20
# `last_outcome` of a pending drop whose DELETE went out after an accepted read and got no
# answer: a plain 401 on the next read is then that DELETE's doing, not a wrong secret.
UNANSWERED = "drop_unanswered"
# Last outcomes after which a plain 401 on the read means the token is not live upstream:
# an unanswered DELETE (above), or a user refused alone (`rejected`: plain 401s while
# other users' reads were accepted, so the client secret was right).
NOT_LIVE = frozenset({UNANSWERED, "rejected"})
REFUSED_READ = (
    "the service refused the credential on a read before the DELETE (plain 401): the client "
    "secret is likely wrong (client.secret_file); no DELETE was sent, since its 204 would "
    "prove nothing, and the token is kept until the drop can be confirmed"
)


log = get_logger("lta_worker.lifecycle")


@dataclass(frozen=True, slots=True)
class DropResult:
    """What a drop or forget did (its fields: docs/python-api.md)."""

    user: str
    upstream: UpstreamResult
    status: int | None
    error: str | None
    previous_state: str
    state: str = "dropped"
    retry_at: datetime | None = None
    purged: int | None = None
    overtaken: bool = False


@dataclass(slots=True)
class DropRetries:
    """What `retry_pending` did: drops confirmed, still pending, and given back (stopped)."""

    confirmed: int = 0
    pending: int = 0
    interrupted: int = 0
    users: list[str] = field(default_factory=list)


class Lifecycle(ClientOperation):
    """Drops and forgets users, and retries the drops the service did not confirm."""

    rng: random.Random = random.Random()

    def __init__(
        self,
        poll: PollSettings,
        store: Store,
        vault: Vault,
        api: ApiClient | Callable[[], ApiClient],
        clock: Callable[[], datetime],
    ) -> None:
        super().__init__(store, vault, api, clock)
        self._poll = poll

    @staticmethod
    async def _paced(
        pacer: PacerLike | None, call: Callable[..., Awaitable[Answer]], *args: Any
    ) -> Answer:
        """`call(*args)` with a permit of `pacer`, if any (fed the status, not the headers)."""
        if pacer is None:
            return await call(*args)
        permit = await pacer.acquire()
        answer: Answer | None = None
        try:
            answer = await call(*args)
        finally:
            pacer.feed(permit, {}, None if answer is None else answer.status)
        return answer

    async def drop(self, user: str) -> DropResult:
        """Mark the user `dropping`, DELETE the token upstream, and on confirmation drop it
        (UnknownUserError; ConfigError when its token does not decrypt: nothing changed)."""
        result = await self._drop(user, reason="dropped", purge=False)
        _dropped_event(result)
        return result

    async def forget(self, user: str) -> DropResult:
        """Drop the user and purge its results, waiting events and estimate (older links stop
        working) in the transaction that marks it `dropping`, whatever the DELETE's answer
        (spec 5, rule 7); errors as `drop`."""
        result = await self._drop(user, reason="forgotten", purge=True)
        _dropped_event(result)
        return result

    async def _drop(self, user: str, *, reason: str, purge: bool) -> DropResult:
        row = await to_thread.run_sync(self._store.get_user, user)
        if row is None:
            raise UnknownUserError(user)
        if row.token is not None:  # a key file problem: found before any change
            register_secret(self._vault.decrypt(row.token, user=user))
        now = self._clock()
        lease_until = now + self._poll.lease_duration
        start = await to_thread.run_sync(
            partial(self._store.begin_drop, user, now, lease_until=lease_until, purge=purge)
        )
        purged = start.purged
        before, after = start.before, start.after
        if start.in_flight or after.state != "dropping":  # another DELETE is out; no token
            held = before if start.in_flight else after
            return DropResult(
                user,
                "in_flight" if start.in_flight else "skipped",
                None,
                None,
                before.state,
                state=held.state,
                retry_at=before.next_due_at if start.in_flight else None,
                purged=purged,
            )
        if before.state != "dropping":
            log.info(
                "user.state_changed",
                user=user,
                **{"from": before.state},
                to="dropping",
                reason=reason,
            )
        try:
            outcome = await self._send_drop(after, reason=reason)
        except BaseException:
            # Interrupted before its write: give the DELETE back to `run` / `serve` now
            # rather than when the lease expires.
            with CancelScope(shield=True), contextlib.suppress(Exception):
                if start.owner is not None:
                    await to_thread.run_sync(self._store.release, start.owner, [after.id])
            raise
        return replace(outcome, previous_state=before.state, purged=purged)

    async def _send_drop(
        self, row: UserRow, *, reason: str, pacer: PacerLike | None = None
    ) -> DropResult:
        """Read once, send the DELETE of a `dropping` user, and record what the answers mean."""
        from lta_worker.upstream import usable_token  # httpx: only when a drop is sent

        assert row.token is not None  # a dropping user holds its token until confirmed
        status: int | None = None
        code: str | None = None
        accepted = False
        token = self._vault.decrypt(row.token, user=row.user)
        register_secret(token)
        if not usable_token(token):
            error: str | None = "the stored token is not a long term token"
            verdict = drop_verdict(None, None)
        else:
            endpoint = next((e for e in ENDPOINTS if row.granted(e)), ENDPOINTS[0])
            answered = await self._paced(pacer, self._api.read, endpoint, token)
            read = classify(endpoint, answered)
            if read.kind == "rejected":
                status, verdict = read.status, "refused"
                if row.last_outcome in NOT_LIVE:  # the 401 says the token is gone, not the secret
                    verdict = "confirmed"
                error = None if verdict == "confirmed" else REFUSED_READ
            else:
                accepted = authenticated(read)
                answer = await self._paced(pacer, self._api.drop, token)
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
                log.info("token.deleted", user=row.user, reason=reason)  # as asked
                log.info(
                    "user.state_changed",
                    user=row.user,
                    **{"from": "dropping"},
                    to="dropped",
                    reason=reason,
                )
                log.info("drop.confirmed", user=row.user, status=status, code=code)
                return DropResult(row.user, "ok", status, None, "dropping", state="dropped")
            return await self._as_stored(row, "ok", status, None)
        upstream: UpstreamResult = "refused" if verdict == "refused" else "failed"
        if verdict == "refused" and error != REFUSED_READ:
            error = (
                "the service refused the credential (HTTP 401): check client.secret_file; "
                "the token may still be live upstream"
            )
        retry_at = drop_retry_at(row.consecutive_failures + 1, now, self._poll.policy(), self.rng)
        # A DELETE sent after an accepted read may have dropped the token though no answer
        # came: remembered, so that the next read's plain 401 confirms the drop.
        mark = UNANSWERED if accepted and status is None else f"drop_{upstream}"
        deferred = await to_thread.run_sync(
            partial(self._store.defer_drop, row.id, row.generation, retry_at=retry_at, reason=mark)
        )
        if not deferred:
            return await self._as_stored(row, upstream, status, error)
        log.warning(
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

    async def _as_stored(
        self, row: UserRow, upstream: UpstreamResult, status: int | None, error: str | None
    ) -> DropResult:
        """The row as stored, marked `overtaken` (the drop's write found the user changed)."""
        current = await to_thread.run_sync(self._store.get_user, row.user)
        state = current.state if current is not None else "dropped"
        retry_at = current.next_due_at if current is not None and state == "dropping" else None
        return DropResult(
            row.user,
            upstream,
            status,
            error,
            "dropping",
            state=state,
            retry_at=retry_at,
            overtaken=True,
        )

    async def retry_pending(
        self,
        pacer: PacerLike,
        *,
        owner: str,
        lease: timedelta,
        stopping: Any = None,
    ) -> DropRetries:
        """Send again, through the pacer, the DELETE of every `dropping` user due for a retry,
        until `stopping()` (the users not yet sent stay due)."""
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
                log.info("drop.retried", user=row.user, attempt=row.consecutive_failures + 1)
                try:
                    result = await self._send_drop(row, reason="dropped", pacer=pacer)
                except TokenDecryptError:
                    # A tampered or copied row: nothing can be sent for it. It stays
                    # `dropping` (never read) and is tried again a parked interval later.
                    log.error(
                        "token.undecryptable",
                        user=row.user,
                        key_id=row.token.key_id if row.token else None,
                    )
                    retry_at = self._clock() + self._poll.parked_interval
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
                done.users.append(row.user)
                if result.state == "dropped":
                    done.confirmed += 1
                else:
                    done.pending += 1
        if given_back:
            await to_thread.run_sync(self._store.release, owner, given_back)
        return done


def _dropped_event(result: DropResult) -> None:
    log.info(
        "user.dropped",
        user=result.user,
        upstream=result.upstream,
        status=result.status,
        error=result.error,
        state=result.state,
        purged=result.purged is not None,
        purged_rows=result.purged,
        overtaken=result.overtaken,
    )
