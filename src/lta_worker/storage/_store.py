"""`Store`: every query group over one database; synchronous, one short transaction a call."""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import URL, delete

from lta_worker.domain import PurgeCounts
from lta_worker.errors import InstanceLockedError, SchemaOutdatedError
from lta_worker.storage import _feed as feed
from lta_worker.storage import _migrate as migrate
from lta_worker.storage import _results as results
from lta_worker.storage._db import Database, Dialect
from lta_worker.storage._drops import DropQueries
from lta_worker.storage._enrollments import EnrollmentQueries
from lta_worker.storage._feed import FeedQueries
from lta_worker.storage._instances import InstanceQueries
from lta_worker.storage._leases import LeaseQueries
from lta_worker.storage._models import FeedGone
from lta_worker.storage._outbox import OutboxQueries
from lta_worker.storage._results import ResultQueries
from lta_worker.storage._rotation import RotationQueries
from lta_worker.storage._schedule import ScheduleQueries
from lta_worker.storage._users import UserQueries


class Store(
    UserQueries,
    LeaseQueries,
    DropQueries,
    ScheduleQueries,
    ResultQueries,
    FeedQueries,
    OutboxQueries,
    EnrollmentQueries,
    InstanceQueries,
    RotationQueries,
):
    """Users, tokens (encrypted), results, pending enrollments, instances, budget, passes."""

    @classmethod
    def open(cls, url: str | URL, *, read_only: bool = False) -> Store:
        """Open the database at `url` (connects lazily); `read_only`: see `Database.open`."""
        return cls(Database.open(url, read_only=read_only))

    def close(self) -> None:
        """Close every pooled connection."""
        self._db.engine.dispose()

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

    def upgrade(self) -> bool:
        """Migrate to this code's schema (SchemaTooNewError if newer); True when one ran."""
        ran = migrate.upgrade(self._db)
        feed.follow_cluster(self._db)
        return ran

    def schema_revision(self) -> str | None:
        """The schema revision stamped in the database (None when empty)."""
        with self._db.read() as conn:
            return migrate.current_revision(conn)

    def check_schema(self) -> None:
        """Raise SchemaTooNewError or SchemaOutdatedError unless the schema is this code's."""
        revision = self.schema_revision()
        status = migrate.classify(revision)
        if status == "current":
            return
        found = "has no lta-worker schema" if status == "empty" else f"is at {revision!r}"
        raise SchemaOutdatedError(
            f"the database {found}; this lta-worker needs revision {migrate.HEAD_REVISION!r}"
        )

    def purge_expired(
        self, now: datetime, after: timedelta, history: timedelta | None = None
    ) -> PurgeCounts:
        """Retention purge: results of users revoked/dropped `after` ago, dead consents, and
        (with `history`) older past contents and feed lines."""
        with self._db.write() as conn:
            counts, gone = results.purge_expired_results(conn, now, after)
            feed.record_gone(conn, self.dialect, gone, "retention", now)
            pruned = results.prune_history(conn, now, history) if history is not None else 0
            if history is not None:
                conn.execute(delete(FeedGone).where(FeedGone.at < now - history))
        pending = self.purge_pending(now)
        return dataclasses.replace(counts, pending=pending, history_pruned=pruned)

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
        """Hold `<dbfile>.lock` (SQLite; InstanceLockedError when taken); no-op on PostgreSQL."""
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
