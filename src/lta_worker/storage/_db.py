"""Engines (SQLite pragmas, PostgreSQL waits bounded by `WAIT_S`, read-only opens) and
transactions; docs/operations.md, *PostgreSQL for several instances*, *Read-only commands*.
SQLite writes start with `BEGIN IMMEDIATE`: the write lock up front, never "locked" midway.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from importlib import import_module
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from sqlalchemy import (
    URL,
    ColumnElement,
    Connection,
    Engine,
    Row,
    Select,
    create_engine,
    event,
    make_url,
    tuple_,
)
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from lta_worker.errors import ConfigError, NoDatabaseError
from lta_worker.storage._dberrors import DATABASE_ERRORS, SQLITE_WRITABLE_HINT, map_driver_error

Dialect = Literal["sqlite", "postgresql"]

WAIT_S = 30
BUSY_TIMEOUT_MS = WAIT_S * 1000
_BEGIN_OPTION = "lta_sqlite_begin"
# JSON columns hold strict JSON only (RFC 8259): a NaN or an infinity is refused at the
# write instead of being stored as `NaN`/`Infinity`, which no JSON reader accepts.
_STRICT_JSON = partial(json.dumps, allow_nan=False)


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL (ConfigError if unusable); `postgres(ql)://` uses psycopg 3."""
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
    """Create the directory and an empty 0600 file (WAL files inherit it); ConfigError if not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                pass
            else:
                os.close(fd)
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(
            f"cannot create the SQLite database {str(path)!r} ({exc.strerror})",
            key="database.url",
            hint="make its directory writable by the user running lta-worker, "
            "or set database.url to a writable place",
        ) from None
    check_database_mode(path, mode)


def check_database_mode(path: Path, mode: int) -> None:
    """ConfigError for a SQLite file that is not regular or open to others (0640 is fine)."""
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{str(path)!r} is not a regular file", key="database.url")
    if mode & 0o007:
        raise ConfigError(
            f"the SQLite database {str(path)!r} is open to others "
            f"(mode {stat.S_IMODE(mode):04o}); it holds results and encrypted tokens",
            key="database.url",
            hint=f"chmod o-rwx {path}",
        )


def require_sqlite_writable(path: Path) -> None:
    """ConfigError when this user could not write the SQLite file or its directory."""
    if path.exists() and not os.access(path, os.W_OK):
        where = f"the SQLite database {str(path)!r}"
    elif not os.access(path.parent, os.W_OK | os.X_OK):
        where = f"the directory {str(path.parent)!r} of the SQLite database (WAL and journal)"
    else:
        return
    raise ConfigError(
        f"{where} is not writable by this user: run and serve would fail",
        key="database.url",
        hint=SQLITE_WRITABLE_HINT,
    )


def _sqlite_on_connect_ro(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN (see `_sqlite_on_begin`)
    dbapi_connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


def _sqlite_on_connect(dbapi_connection: Any, record: Any) -> None:
    _sqlite_on_connect_ro(dbapi_connection, record)
    _enable_wal(dbapi_connection)
    dbapi_connection.execute("PRAGMA synchronous = FULL")
    dbapi_connection.execute("PRAGMA foreign_keys = ON")


def _enable_wal(conn: Any) -> None:
    """Switch the file to WAL, retried up to the busy timeout: SQLite may answer "locked"
    to the switch without calling its busy handler (another process creating the file)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _existing_sqlite_file(path: Path) -> None:
    """NoDatabaseError when the file is missing, ConfigError when it cannot be used."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise NoDatabaseError(
            f"the SQLite database {str(path)!r} does not exist; this command only reads "
            "and never creates it"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot use the SQLite database {str(path)!r} ({exc.strerror})",
            key="database.url",
        ) from None
    check_database_mode(path, mode)


def _create_readonly_engine(url: URL) -> Engine:
    if url.get_backend_name() == "sqlite":
        path = sqlite_path(url)
        if path is None:  # in-memory: nothing to protect, nothing to read either
            return create_store_engine(url)
        _existing_sqlite_file(path)
        target = f"file:{quote(str(path.resolve()))}?mode=ro"
        if not Path(f"{path}-wal").exists():
            # No writer holds it: read the file alone. A read-only connection would create
            # -wal and -shm files owned by whoever runs the command (root), locking the
            # service's user out; a writer starting meanwhile leaves the main file as is.
            target += "&immutable=1"
        engine = create_engine(
            url,
            hide_parameters=True,
            json_serializer=_STRICT_JSON,
            creator=lambda: sqlite3.connect(
                target, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
            ),
        )
        event.listen(engine, "connect", _sqlite_on_connect_ro)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return _postgresql_engine(
        url, "-c default_transaction_read_only=on", pool_size=2, max_overflow=2
    )


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
        engine = create_engine(url, hide_parameters=True, json_serializer=_STRICT_JSON, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return _postgresql_engine(url, pool_size=5, max_overflow=10)


def _postgresql_engine(url: URL, options: str = "", **pool: Any) -> Engine:
    """A PostgreSQL engine through psycopg 3, every wait bounded, `options` last."""
    query = url.query
    bounds = {"connect_timeout": WAIT_S, "tcp_user_timeout": WAIT_S * 1000}
    connect_args: dict[str, Any] = {k: v for k, v in bounds.items() if k not in query}
    given = query.get("options", "")
    connect_args["options"] = " ".join(
        filter(
            None,
            (
                f"-c statement_timeout={WAIT_S}s -c lock_timeout={WAIT_S}s",
                given if isinstance(given, str) else " ".join(given),
                options,
            ),
        )
    )
    try:
        return create_engine(
            url,
            hide_parameters=True,
            json_serializer=_STRICT_JSON,
            pool_pre_ping=True,
            pool_timeout=WAIT_S,
            connect_args=connect_args,
            **pool,
        )
    except ImportError:
        raise ConfigError(
            "needs the PostgreSQL driver psycopg, which is not installed",
            key="database.url",
            hint="pip install 'lta-worker[postgresql]'",
        ) from None


@dataclass(frozen=True)
class Database:
    """The engine plus what queries need to know about it."""

    engine: Engine
    dialect: Dialect
    path: Path | None
    read_only: bool = False

    @classmethod
    def open(cls, url: str | URL, *, read_only: bool = False) -> Database:
        """Open (lazily connect to) the database at `url`."""
        parsed = normalize_url(url)
        engine = _create_readonly_engine(parsed) if read_only else create_store_engine(parsed)
        dialect: Dialect = "sqlite" if parsed.get_backend_name() == "sqlite" else "postgresql"
        return cls(engine=engine, dialect=dialect, path=sqlite_path(parsed), read_only=read_only)

    @contextmanager
    def write(self, *, foreign_keys: bool = True) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), committed when the block ends;
        `foreign_keys=False`: SQLite enforces none in it (see `migrations/env.py`)."""
        with self._mapped_errors(), self.engine.connect() as conn:
            if self.dialect == "sqlite":
                conn.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
            # SQLite ignores the pragma inside a transaction: set it before BEGIN.
            raw = conn.connection.driver_connection if self.dialect == "sqlite" else None
            if raw is not None and not foreign_keys:
                raw.execute("PRAGMA foreign_keys = OFF")
            try:
                with conn.begin():
                    yield conn
            finally:
                if raw is not None and not foreign_keys:
                    raw.execute("PRAGMA foreign_keys = ON")

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction (deferred BEGIN on SQLite)."""
        with self._mapped_errors(), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        try:
            yield
        except DATABASE_ERRORS as exc:
            raise map_driver_error(exc, self.engine.url.password, self.path) from exc

    def pages(
        self,
        query: Select[*tuple[Any, ...]],
        keys: tuple[ColumnElement[Any], ...],
        after: tuple[Any, ...],
        batch: int,
    ) -> Iterator[Row[Any]]:
        """The rows of `query` past `after` in `keys` order, one short transaction per batch."""
        while True:
            page = query.where(tuple_(*keys) > tuple_(*after)).order_by(*keys).limit(batch)
            with self.read() as conn:
                rows = conn.execute(page).all()
            if not rows:
                return
            yield from rows
            after = tuple(getattr(rows[-1], key.name) for key in keys)


def insert_for(dialect: Dialect, table: Any) -> Any:
    """An INSERT with the backend's `on_conflict_do_*` (PostgreSQL's module is slow to import)."""
    return import_module(f"sqlalchemy.dialects.{dialect}").insert(table)


class Queries:
    """A group of queries over one database; `Store` is all of them together."""

    def __init__(self, db: Database) -> None:
        self._db = db
