"""`Store`: the one object the engine, the CLI and enrollment use to reach the database.

Synchronous SQLAlchemy; the async engine calls it through `anyio.to_thread`. Every method is
one short transaction (or a series of them for iterators), safe to call from several threads.
The queries live in `users`, `results`, `enrollments`, `instances` and `rotation`.

Longer than the ~400-line ceiling on purpose: it is the storage layer's whole face, one
thin method per query (each a line or two delegating to the query modules), and splitting
it would split the one type every caller holds.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeVar

from sqlalchemy import URL

from lta_worker.domain import (
    BudgetSeen,
    ChangeEstimate,
    ChangeFeed,
    EncryptedToken,
    Endpoint,
    HistoryRow,
    InstanceKind,
    InstanceRow,
    OutboxCounts,
    PassRecord,
    PendingEnrollment,
    PendingEvent,
    PurgeCounts,
    ReadHealth,
    ResultEvents,
    ResultRow,
    UserRow,
    UserState,
    UserUpdate,
)
from lta_worker.errors import InstanceLockedError, SchemaOutdatedError
from lta_worker.secret import Secret
from lta_worker.storage import _drops as drops
from lta_worker.storage import _enrollments as enrollments
from lta_worker.storage import _feed as feed
from lta_worker.storage import _freshness as freshness
from lta_worker.storage import _instances as instances
from lta_worker.storage import _leases as leases
from lta_worker.storage import _migrate as migrate
from lta_worker.storage import _outbox as outbox
from lta_worker.storage import _results as results
from lta_worker.storage import _rotation as rotation
from lta_worker.storage import _schedule as schedule
from lta_worker.storage import _users as users
from lta_worker.storage._db import Database, Dialect
from lta_worker.storage._rotation import StoredSecret
from lta_worker.storage._vault import Purpose

T = TypeVar("T")


class Store:
    """Users, tokens (encrypted), results, pending enrollments, instances, budget, passes."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.result_events: ResultEvents = "hash"
        """What `apply` queues when a read stored a changed content: a `result.changed`
        event with its hashes, with the content too, or nothing ("off"); the worker sets it
        from `[webhook]` (`WebhookSettings.result_events`)."""
        self.on_lease_expired: Callable[[str, int], None] | None = None
        """Called with (owner, users) when `claim_due` takes over users whose lease, held
        by another owner, expired (that owner likely died); the worker logs it."""

    @classmethod
    def open(cls, url: str | URL, *, read_only: bool = False) -> Store:
        """Open the database at `url` (SQLite file or PostgreSQL); connects lazily.

        `read_only`: never create the SQLite file, and refuse every write at the database
        (the read-only commands); a missing SQLite file raises SchemaOutdatedError.
        """
        return cls(Database.open(url, read_only=read_only))

    def close(self) -> None:
        """Close every pooled connection."""
        self._db.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store(dialect={self.dialect!r})"

    @property
    def dialect(self) -> Dialect:
        """`sqlite` or `postgresql`."""
        return self._db.dialect

    @property
    def database(self) -> Database:
        """The underlying engine wrapper (tests, maintenance)."""
        return self._db

    # -- schema ---------------------------------------------------------------------------

    def upgrade(self) -> bool:
        """Migrate to the schema this code knows; True when a migration ran.

        Raises:
            SchemaTooNewError: the database was migrated by a newer lta-worker.
        """
        return migrate.upgrade(self._db)

    def schema_revision(self) -> str | None:
        """The schema revision stamped in the database (None when empty)."""
        with self._db.read() as conn:
            return migrate.current_revision(conn)

    def check_schema(self) -> None:
        """Raise unless the schema is exactly the one this code knows.

        Raises:
            SchemaTooNewError: the database was migrated by a newer lta-worker (exit 78).
            SchemaOutdatedError: reason `schema_outdated`: the schema is missing or older
                (exit 78; migrate it: `upgrade`).
        """
        revision = self.schema_revision()
        status = migrate.classify(revision)
        if status == "current":
            return
        found = "has no lta-worker schema" if status == "empty" else f"is at {revision!r}"
        raise SchemaOutdatedError(
            f"the database {found}; this lta-worker needs revision {migrate.HEAD_REVISION!r}"
        )

    # -- users ------------------------------------------------------------------------------

    def get_user(self, user: str) -> UserRow | None:
        """The user with the client's user id `user`, or None."""
        return users.get_user(self._db, user)

    def list_users(self, batch: int = 500) -> Iterator[UserRow]:
        """Every user in id order, read in keyset batches of `batch`."""
        return users.list_users(self._db, batch)

    def count_by_state(self) -> dict[str, int]:
        """Users per state, every state present."""
        return users.count_by_state(self._db)

    def rate_buckets(self) -> list[tuple[tuple[int, int], float]]:
        """Active users counted per (plan_bucket, rate_bucket), for the freshness plan."""
        return freshness.rate_buckets(self._db)

    def sample_estimates(self, limit: int = freshness.SAMPLE) -> list[ChangeEstimate]:
        """Up to `limit` stored change estimates of active users (for the day's shape)."""
        return freshness.sample_estimates(self._db, limit)

    def read_health(self) -> ReadHealth:
        """The latest answered read, and the users whose last read failed after it."""
        return users.read_health(self._db)

    def count_due(self, now: datetime) -> int:
        """Users holding a token with `next_due_at <= now`."""
        return users.count_due(self._db, now)

    def claim_due(
        self,
        *,
        now: datetime,
        due_before: datetime,
        limit: int,
        owner: str,
        lease_until: datetime,
    ) -> list[UserRow]:
        """Lease up to `limit` due users to `owner`, oldest `next_due_at` then id first.

        Users whose lease by another owner expired are taken too; `on_lease_expired` hears
        of them.
        """
        expired: Counter[str] = Counter()
        rows = users.claim_due(
            self._db,
            now=now,
            due_before=due_before,
            limit=limit,
            owner=owner,
            lease_until=lease_until,
            expired=expired,
        )
        if self.on_lease_expired is not None:
            for previous, count in sorted(expired.items()):
                self.on_lease_expired(previous, count)
        return rows

    def renew_leases(
        self, owner: str, lease_until: datetime, held: set[tuple[int, int]] | None = None
    ) -> int:
        """Extend the leases `owner` holds; return how many; `held` receives the leases
        (user id, generation) `owner` holds after it."""
        return leases.renew_leases(self._db, owner, lease_until, held)

    def release(self, owner: str, user_ids: Iterable[int] | None = None) -> int:
        """Drop the leases `owner` holds (only on `user_ids` when given); return how many."""
        return leases.release(self._db, owner, None if user_ids is None else list(user_ids))

    def release_all(self) -> dict[str, int]:
        """Drop every lease; return how many users each owner held (SQLite at start-up:
        the single-instance lock proves every owner dead)."""
        return leases.release_all(self._db)

    def apply(
        self,
        updates: Sequence[UserUpdate],
        owner: str | None = None,
        *,
        now: datetime | None = None,
        discarded: list[tuple[UserUpdate, str]] | None = None,
    ) -> int:
        """Write users' turns in one transaction (idempotent, fenced); return how many applied.

        See `users.apply`. `now` stamps `revoked_at`/`dropped_at` (default: the update's
        `last_polled_at`, else the clock); `discarded` receives the updates not applied,
        with why (`changed` or `failed`).
        """
        return users.apply(self._db, updates, owner, now, discarded, results=self.result_events)

    def store_token(
        self,
        user: str,
        token: EncryptedToken,
        scopes: Sequence[str],
        now: datetime,
        next_due_at: datetime,
    ) -> bool:
        """Insert the user or rotate its token (state active); True when it rotated one."""
        return users.store_token(
            self._db, user, token, scopes=scopes, now=now, next_due_at=next_due_at
        )

    def delete_token(self, user: str, state: UserState, now: datetime) -> bool:
        """Delete the token and set `state` (revoked|dropped) together; True if one was there.

        Raises:
            UnknownUserError: no such user.
        """
        return users.delete_token(self._db, user, state, now)

    def follow_schedule(
        self, interval: timedelta, parked_interval: timedelta, now: datetime
    ) -> dict[str, int] | None:
        """Reschedule users by class when the intervals changed (see `schedule`).

        Returns None when the intervals are those last applied, else users moved per class.
        """
        return schedule.follow_schedule(self._db, interval, parked_interval, now)

    # -- two-phase drop ---------------------------------------------------------------------

    def begin_drop(
        self,
        user: str,
        now: datetime,
        *,
        lease_until: datetime | None = None,
        purge: bool = False,
    ) -> drops.DropStart:
        """Mark the user `dropping` (generation bumped), unless it holds no token or another
        sender's DELETE is out (`in_flight`); with `lease_until`, lease it to the command
        for its DELETE (`DropStart.owner`); with `purge`, delete its stored results in the
        same transaction (`DropStart.purged`).

        Raises:
            UnknownUserError: no such user.
        """
        return drops.begin_drop(self._db, user, now, lease_until=lease_until, purge=purge)

    def finish_drop(self, user_id: int, generation: int, now: datetime) -> bool:
        """The DELETE was confirmed: token deleted, state `dropped` (if still that drop)."""
        return drops.finish_drop(self._db, user_id, generation, now)

    def defer_drop(self, user_id: int, generation: int, *, retry_at: datetime, reason: str) -> bool:
        """The DELETE was not confirmed: still `dropping`, retried at `retry_at`."""
        return drops.defer_drop(self._db, user_id, generation, retry_at=retry_at, reason=reason)

    def claim_drops(
        self, *, now: datetime, limit: int, owner: str, lease_until: datetime
    ) -> list[UserRow]:
        """Lease `dropping` users due for a DELETE retry."""
        return drops.claim_drops(
            self._db, now=now, limit=limit, owner=owner, lease_until=lease_until
        )

    # -- results ----------------------------------------------------------------------------

    def purge_results(self, user: str) -> int:
        """Delete the user's snapshots and history; return the number of rows."""
        return results.purge_results(self._db, user)

    def purge_expired(
        self, now: datetime, after: timedelta, history: timedelta | None = None
    ) -> PurgeCounts:
        """Retention purge: results of users revoked/dropped `after` ago, dead consents, and
        (with `history`) past contents older than that, each (user, endpoint)'s newest kept."""
        with self._db.write() as conn:
            counts = results.purge_expired_results(conn, now, after)
            pruned = results.prune_history(conn, now, history) if history is not None else 0
        pending = enrollments.purge_pending(self._db, now)
        return dataclasses.replace(counts, pending=pending, history_pruned=pruned)

    def export_history(
        self, user: str | None = None, since: datetime | None = None
    ) -> Iterator[ResultRow]:
        """Every stored past content (of one user, fetched at or after `since`), in order."""
        return results.export_history(self._db, user, since)

    def export_results(self, user: str | None = None) -> Iterator[ResultRow]:
        """The latest result per user and endpoint (of one user when given)."""
        return results.export_results(self._db, user)

    def changed_since(self, cursor: int, user: str | None = None) -> ChangeFeed:
        """The results stored after `cursor` (0: all; of one user when given), in the order
        stored, and the cursor to pass next time (see `feed`).

        Raises:
            ValueError: a negative cursor.
        """
        return feed.changed_since(self._db, cursor, user)

    def history(self, user: str, endpoint: Endpoint) -> list[HistoryRow]:
        """Every distinct content stored for (user, endpoint), oldest first."""
        return results.history(self._db, user, endpoint)

    # -- webhook outbox (see `outbox`) -------------------------------------------------------

    def claim_events(
        self, now: datetime, limit: int, lease_until: datetime, owner: str = "-"
    ) -> list[PendingEvent]:
        """Lease the oldest due event of up to `limit` users to `owner` (order per user kept)."""
        return outbox.claim_heads(self._db, now, limit, lease_until, owner)

    def release_events(self, now: datetime) -> int:
        """Make every leased event due now (SQLite at start-up: every owner is dead)."""
        return outbox.release_leases(self._db, now)

    def events_delivered(self, ids: Sequence[int]) -> int:
        """Delete acknowledged events."""
        return outbox.delivered(self._db, ids)

    def event_failed(self, event_id: int, retry_at: datetime, error: str) -> None:
        """Back a failed event off until `retry_at`."""
        outbox.failed(self._db, event_id, retry_at, error)

    def dead_letter_events(self, now: datetime, max_age: timedelta) -> int:
        """Dead-letter events older than `max_age`; return how many."""
        return outbox.dead_letter(self._db, now, max_age)

    def purge_events(self, now: datetime, keep_dead: timedelta, *, live: bool = False) -> int:
        """Delete dead events older than `keep_dead` (every live one too when `live`)."""
        with self._db.write() as conn:
            return outbox.purge(conn, now, keep_dead, live=live)

    def outbox_counts(self) -> OutboxCounts:
        """Events waiting and dead-lettered."""
        return outbox.counts(self._db)

    # -- pending enrollments ----------------------------------------------------------------

    def save_pending(self, state: str | Secret, pending: PendingEnrollment) -> None:
        """Store a started consent under the sha256 of its OAuth state."""
        enrollments.save_pending(
            self._db,
            state=state,
            user=pending.user,
            verifier=pending.verifier,
            redirect_uri=pending.redirect_uri,
            created_at=pending.created_at,
            expires_at=pending.expires_at,
        )

    def take_pending(self, state: str | Secret, now: datetime) -> PendingEnrollment | None:
        """Take a started consent once: None when unknown, already used or expired."""
        return enrollments.take_pending(self._db, state, now)

    def spend_link(self, nonce: str, user: str, now: datetime, expires_at: datetime) -> bool:
        """Mark an enrollment link used (kept until `expires_at`); False if it already was."""
        return enrollments.spend_link(self._db, nonce, user, now, expires_at)

    # -- instances, passes, budget ----------------------------------------------------------

    def take_latest_pending(self, user: str, now: datetime) -> PendingEnrollment | None:
        """Take the newest live pending enrollment of `user`, once (a bare code has no state)."""
        return enrollments.take_latest_pending(self._db, user, now)

    def register_instance(
        self,
        instance: str,
        kind: InstanceKind,
        now: datetime,
        *,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        """Record this process as a live instance (host and pid default to this process)."""
        instances.register_instance(self._db, instance, kind, now, host=host, pid=pid)

    def heartbeat(self, instance: str, now: datetime) -> bool:
        """Mark the instance alive; False when it is not registered."""
        return instances.heartbeat(self._db, instance, now)

    def live_instances(self, now: datetime, ttl: timedelta) -> list[InstanceRow]:
        """Instances with a heartbeat within `ttl` of `now`."""
        return instances.live_instances(self._db, now, ttl)

    def unregister(self, instance: str) -> None:
        """Forget the instance and drop the leases it holds."""
        instances.unregister(self._db, instance)

    def prune_instances(self, now: datetime, ttl: timedelta) -> int:
        """Delete instances silent for longer than `ttl`."""
        return instances.prune_instances(self._db, now, ttl)

    def record_pass(self, record: PassRecord) -> None:
        """Store a pass summary (the newest 1000 are kept)."""
        instances.record_pass(self._db, record)

    def last_pass(
        self, stopped: str | None = None, *, read: bool = False, answered: bool = False
    ) -> PassRecord | None:
        """The pass that finished last (that stopped as `stopped`, e.g. `completed`; that made
        reads; that had reads the service answered), or None."""
        return instances.last_pass(self._db, stopped, read=read, answered=answered)

    def first_pass(self) -> PassRecord | None:
        """The oldest pass summary kept, or None."""
        return instances.last_pass(self._db, first=True)

    def record_budget(self, client_id: str, seen: BudgetSeen) -> None:
        """Store the budget the service reported (ignored when older than the stored one)."""
        instances.record_budget(self._db, client_id, seen)

    def budget_seen(self, client_id: str) -> BudgetSeen | None:
        """The budget the service last reported for `client_id`, or None."""
        return instances.budget_seen(self._db, client_id)

    def update_budget(self, client_id: str, fn: instances.BudgetFn[T]) -> T:
        """Run `fn` on the client's budget row under a lock and write back what it returns.

        See `instances.update_budget`: the one transaction in which instances sharing a
        database settle answers and take permits.
        """
        return instances.update_budget(self._db, client_id, fn)

    # -- key rotation -----------------------------------------------------------------------

    def key_ids_in_use(self, now: datetime) -> dict[str, int]:
        """How many stored tokens and live verifiers use each key id."""
        return rotation.key_ids_in_use(self._db, now)

    def secrets_for_rotation(
        self,
        kind: Purpose,
        *,
        exclude_key_id: str,
        now: datetime,
        after: int | str | None = None,
        limit: int = rotation.DEFAULT_BATCH,
    ) -> list[StoredSecret]:
        """The next batch of stored secrets of `kind` not yet under `exclude_key_id`."""
        return rotation.secrets_for_rotation(
            self._db, kind, exclude_key_id=exclude_key_id, now=now, after=after, limit=limit
        )

    def reencrypt(self, swaps: Sequence[tuple[StoredSecret, EncryptedToken]]) -> int:
        """Compare-and-swap new ciphertexts in; return how many rows changed."""
        return rotation.reencrypt(self._db, swaps)

    # -- SQLite housekeeping ----------------------------------------------------------------

    def checkpoint(self) -> bool:
        """Checkpoint and truncate the SQLite WAL; True when complete. No-op on PostgreSQL."""
        if self.dialect != "sqlite":
            return True
        raw = self._db.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            row = cursor.fetchone()
            cursor.close()
        finally:
            raw.close()
        return row is not None and int(row[0]) == 0

    @contextmanager
    def single_instance_lock(self) -> Iterator[None]:
        """Hold an exclusive lock on `<dbfile>.lock` (SQLite); no-op on PostgreSQL.

        Raises:
            InstanceLockedError: another run or serve holds the lock.
        """
        path = self._db.path
        if path is None:
            yield
            return
        lock_path = lock_file(path)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InstanceLockedError(
                    f"another lta-worker run or serve is already working on {str(path)!r}",
                    hint=f"let it finish (it holds {str(lock_path)!r}); several instances at "
                    "once need PostgreSQL",
                ) from None
            yield
        finally:
            os.close(fd)


def lock_file(database: Path) -> Path:
    """The lock file that `single_instance_lock` uses for a SQLite database file."""
    return database.with_name(database.name + ".lock")
