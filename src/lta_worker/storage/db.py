"""Engine creation, SQLite pragmas, transactions, and mapping driver errors to StorageError.

SQLite: WAL, a busy timeout, `synchronous=FULL`, foreign keys on. The sqlite3 module's own
transaction handling is switched off and SQLAlchemy emits BEGIN itself, so that write
transactions start with `BEGIN IMMEDIATE`: they take the write lock up front and wait for it
(busy timeout) instead of failing with "database is locked" when a deferred read transaction
tries to upgrade while another process writes. Reads use a plain deferred BEGIN; under WAL
they never block writers.

PostgreSQL goes through psycopg 3: `postgresql://` and `postgres://` map to
`postgresql+psycopg://`.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import StaticPool

from lta_worker.errors import ConfigError, StorageError

Dialect = Literal["sqlite", "postgresql"]

BUSY_TIMEOUT_MS = 30_000
_BEGIN_OPTION = "lta_sqlite_begin"


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL; `postgresql://` and `postgres://` become `postgresql+psycopg://`.

    Raises:
        ConfigError: naming `database.url` when the URL cannot be used.
    """
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError("is not a valid database URL", key="database.url") from None
    if parsed.drivername in {"postgresql", "postgres"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername not in {"sqlite", "sqlite+pysqlite", "postgresql+psycopg"}:
        raise ConfigError(
            f"driver {parsed.drivername!r} is not supported",
            key="database.url",
            hint="use sqlite:////path/to/lta.db or postgresql://user@host/dbname",
        )
    return parsed


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL, or None for an in-memory database."""
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None
    return Path(database)


def _prepare_sqlite_file(path: Path) -> None:
    """Create the parent directory and an empty 0600 file, so WAL files inherit 0600 too."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return
        os.close(fd)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN (see `_sqlite_on_begin`)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _enable_wal(cursor)
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (persistent: a no-op once done), riding out a busy file.

    SQLite may answer "database is locked" to the switch without calling the busy handler
    (it avoids a deadlock that way), for instance while another process creates the same new
    database; so the switch is retried for up to the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_on_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


def create_store_engine(url: URL) -> Engine:
    """Create the engine for a normalized URL, with the SQLite set-up described above."""
    if url.get_backend_name() == "sqlite":
        path = sqlite_path(url)
        kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}
        if path is None:
            kwargs["poolclass"] = StaticPool
            kwargs["connect_args"]["check_same_thread"] = False
        else:
            _prepare_sqlite_file(path)
        engine = create_engine(url, hide_parameters=True, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return create_engine(
        url, hide_parameters=True, pool_pre_ping=True, pool_size=5, max_overflow=10
    )


def describe(exc: DBAPIError) -> str:
    """A one-line description of a driver error, without SQL or parameters."""
    orig = exc.orig
    text = str(orig).strip().splitlines()[0] if orig is not None and str(orig).strip() else ""
    kind = type(orig).__name__ if orig is not None else type(exc).__name__
    return f"{kind}: {text}" if text else kind


@dataclass(frozen=True)
class Database:
    """The engine plus what queries need to know about it."""

    engine: Engine
    dialect: Dialect
    path: Path | None

    @classmethod
    def open(cls, url: str | URL) -> Database:
        """Open (lazily connect to) the database at `url`."""
        parsed = normalize_url(url)
        engine = create_store_engine(parsed)
        dialect: Dialect = "sqlite" if parsed.get_backend_name() == "sqlite" else "postgresql"
        return cls(engine=engine, dialect=dialect, path=sqlite_path(parsed))

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), committed when the block ends."""
        with _mapped_errors(), self.engine.connect() as conn:
            if self.dialect == "sqlite":
                conn.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction (deferred BEGIN on SQLite)."""
        with _mapped_errors(), self.engine.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()


@contextmanager
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:
        raise StorageError(
            f"the database refused the operation ({describe(exc)})",
            hint="check database.url and that the database is reachable; the pass can be rerun",
        ) from exc
