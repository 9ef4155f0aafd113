"""`LtaApi` (docs/python-api.md). It never migrates the database: a newer web app never
changes the worker's schema under it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Self, cast

from lta_worker.config import start_url
from lta_worker.errors import UnknownUserError
from lta_worker.report import result_json, user_json
from lta_worker.runtime import Runtime
from lta_worker.secret import Secret

if TYPE_CHECKING:
    import httpx

    from lta_worker.api._payloads import FeedLine, ResultLine, UserStatus
    from lta_worker.config import Settings
    from lta_worker.enrollment import DropResult, EnrollResult
    from lta_worker.runtime import Clock


@dataclass(frozen=True, slots=True)
class Changes:
    """The feed's lines after a cursor, oldest first (read once), and the next cursor."""

    lines: Iterator[FeedLine]
    cursor: str


class LtaApi:
    """Enrollment, drops and forgets, and what the worker read, for one application.

    `with` for the sync calls, `async with` for every call (docs/python-api.md);
    `transport` replaces the network (tests).

    Raises (on entering):
        SchemaOutdatedError: no database, no schema, or an older one (`db upgrade`).
        SchemaTooNewError: the database was migrated by a newer lta-worker.
        StorageError: the database cannot be reached.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._runtime = Runtime(settings, migrate=False, clock=clock, transport=transport)

    def __enter__(self) -> Self:
        _ = self._runtime.store
        return self

    def __exit__(self, *exc: object) -> None:
        self._runtime.close()

    async def __aenter__(self) -> Self:
        await self._runtime.__aenter__()
        try:
            _ = self._runtime.store
        except BaseException:
            await self._runtime.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runtime.__aexit__(*exc)

    def start_enrollment(self, user: str) -> str:
        """The consent URL to send `user`'s browser to (sync; a pending consent, 10 minutes)."""
        return self._runtime.enrollment().start(user)

    async def finish_enrollment(
        self, user: str, redirect_url: str, *, state: str | None = None
    ) -> EnrollResult:
        """Finish what `start_enrollment` began, from the URL the service redirected the
        browser to (async): the long term token created and stored, the user `active`.

        Raises:
            UsageError: no code, or the consent is unknown, used, expired or another user's.
            ModeNotOpenedError: long term mode is not open on this client.
            EnrollmentError: the consent, the exchange or the token creation failed.
        """
        return await self._runtime.enrollment().finish(user, redirect_url, state=state)

    async def enroll_with_user_token(self, user: str, user_access_token: str) -> EnrollResult:
        """Enroll `user` with a user access token from the app's own long term consent (async)."""
        token = Secret(user_access_token)
        return await self._runtime.enrollment().from_user_token(user, token)

    def enrollment_link(self, user: str, valid: timedelta = timedelta(days=1)) -> str:
        """A signed, single-use link to the browser enrollment `serve` hosts (sync).

        Raises:
            ConfigError: either setting is missing, or the key file is unusable.
            UsageError: a bad user id, or `valid` outside 1 minute to 30 days.
        """
        from lta_worker.enrollment import EnrollLinks

        runtime = self._runtime
        links = EnrollLinks(runtime.secret("enroll_link_key"), start_url(runtime.settings))
        return links.make(user, runtime.clock.now(), valid)

    async def drop(self, user: str) -> DropResult:
        """End `user`'s access (async): `dropping`, then `dropped` once the service confirms.

        Raises:
            UnknownUserError: no such user.
        """
        return await self._runtime.lifecycle().drop(user)

    async def forget(self, user: str) -> DropResult:
        """Drop `user` and purge every stored result of theirs at once (async).

        Raises:
            UnknownUserError: no such user.
        """
        return await self._runtime.lifecycle().forget(user)

    def user(self, user: str) -> UserStatus:
        """`user`'s state, scopes and read times (sync, reads only).

        Raises:
            UnknownUserError: no such user.
        """
        row = self._runtime.store.get_user(user)
        if row is None:
            raise UnknownUserError(user)
        return cast("UserStatus", user_json(row))

    def results(self, user: str) -> list[ResultLine]:
        """`user`'s latest result per endpoint with its read time (sync, reads only).

        Raises:
            UnknownUserError: no such user.
        """
        store = self._runtime.store
        if store.get_user(user) is None:
            raise UnknownUserError(user)
        return [cast("ResultLine", result_json(row)) for row in store.export_results(user)]

    def changes(self, cursor: str | int = 0, *, user: str | None = None) -> Changes:
        """The change feed after `cursor` (0: from the start), of every user or one (sync).

        Raises:
            CursorError: a cursor this database never issued (read again from 0).
        """
        feed = self._runtime.store.changed_since(cursor, user)
        lines = (cast("FeedLine", result_json(row)) for row in feed.rows)
        return Changes(lines, feed.cursor)
