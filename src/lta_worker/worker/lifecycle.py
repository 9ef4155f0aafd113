"""Ending a user's access on the client's side: drop (token gone) and forget (results gone too).

`drop` asks the service to DELETE the token with its credential, then deletes the local token
and sets the user `dropped`, also when the service could not be reached: the failure is
reported, and the local token is gone either way, so no later pass uses it. A user with no
token (already revoked or dropped) is not sent upstream. `forget` drops, then purges every
stored result of the user (snapshots and history) at once: what the client does when one of
its users deletes their account (spec section 5, rule 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from anyio import to_thread

from lta_worker.errors import UnknownUserError, UpstreamError
from lta_worker.worker.api import long_term_credential
from lta_worker.worker.client_ops import ClientOperation
from lta_worker.worker.logs import get_logger, register_secret

if TYPE_CHECKING:
    pass

UpstreamResult = Literal["ok", "failed", "skipped"]


def _log() -> Any:
    # Looked up per event, not bound at import: a logger bound before `configure_logging`
    # would keep structlog's default configuration.
    return get_logger("lta_worker.lifecycle")


@dataclass(frozen=True, slots=True)
class DropResult:
    """What a drop or forget did.

    Attributes:
        user: the client's user id.
        upstream: `ok` (the service answered 2xx), `failed` (unreachable or another status;
            the local token is deleted anyway), or `skipped` (no token was held).
        status: the service's HTTP status, when it answered.
        error: why the upstream call failed, in words (never a secret).
        previous_state: the user's state before.
        purged: how many stored results (snapshots and history rows) `forget` removed;
            None for a plain drop.
    """

    user: str
    upstream: UpstreamResult
    status: int | None
    error: str | None
    previous_state: str
    purged: int | None = None


class Lifecycle(ClientOperation):
    """Drops and forgets users.

    Args:
        settings: for the client secret file.
        store: users, tokens and results.
        vault: decrypts the token to build the credential for the DELETE.
        api: the service's HTTP interface.
        clock: returns the current aware UTC datetime (`SystemClock().now`, a test clock's
            `now`); the system clock by default.
        client_secret: the client secret (default: read from `client.secret_file` when needed).
    """

    async def drop(self, user: str) -> DropResult:
        """DELETE the token upstream, then delete it locally and set the user `dropped`.

        Raises:
            UnknownUserError: no such user (exit 2).
            ConfigError: the stored token cannot be decrypted (nothing is changed).
        """
        return await self._drop(user, reason="dropped")

    async def forget(self, user: str) -> DropResult:
        """Drop the user, then purge every stored result of theirs (snapshots and history).

        Raises:
            UnknownUserError: no such user (exit 2).
        """
        result = await self._drop(user, reason="forgotten")
        purged = await to_thread.run_sync(self._store.purge_results, user)
        final = DropResult(
            user=result.user,
            upstream=result.upstream,
            status=result.status,
            error=result.error,
            previous_state=result.previous_state,
            purged=purged,
        )
        _dropped_event(final)
        return final

    async def _drop(self, user: str, *, reason: Literal["dropped", "forgotten"]) -> DropResult:
        row = await to_thread.run_sync(self._store.get_user, user)
        if row is None:
            raise UnknownUserError(user)
        upstream: UpstreamResult = "skipped"
        status: int | None = None
        error: str | None = None
        if row.token is not None:
            token = self._vault.decrypt(row.token, user=user)
            register_secret(token)
            try:
                status = await self._api.drop_token(long_term_credential(token, self.client_secret))
            except UpstreamError as exc:
                upstream, error = "failed", exc.message
            except ValueError:
                upstream, error = "failed", "the stored token is not a long term token"
            else:
                upstream = "ok" if 200 <= status < 300 else "failed"
                if upstream == "failed":
                    error = f"the service answered HTTP {status} instead of 204"
        await to_thread.run_sync(self._store.delete_token, user, "dropped", self._clock())
        if row.token is not None:
            _log().warning("token.deleted", user=user, reason=reason)
        if row.state != "dropped":
            _log().info(
                "user.state_changed", user=user, **{"from": row.state}, to="dropped", reason=reason
            )
        result = DropResult(
            user=user, upstream=upstream, status=status, error=error, previous_state=row.state
        )
        if reason == "dropped":
            _dropped_event(result)
        return result


def _dropped_event(result: DropResult) -> None:
    _log().info(
        "user.dropped",
        user=result.user,
        upstream=result.upstream,
        status=result.status,
        error=result.error,
        purged=result.purged is not None,
        purged_rows=result.purged,
    )
