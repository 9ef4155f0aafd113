"""Driver errors are sorted into configuration (78, naming database.url) and temporary (75),
against the real PostgreSQL server and real SQLite files; no message holds the password."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from lta_worker.errors import ConfigError, LtaError, StorageError
from lta_worker.storage import Store, map_driver_error

PG_ENV = "LTA_TEST_DATABASE_URL"
PASSWORD = "hunter2-pw"


def _server() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"set {PG_ENV} to run the PostgreSQL cases")
    return url.split("@", 1)[1].split("/", 1)[0]


def _failure(url: str) -> LtaError:
    with Store.open(url) as store, pytest.raises(LtaError) as info, store.database.read() as conn:
        conn.execute(text("SELECT 1"))
    return info.value


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("role", "rest", "expected"),
    [
        ("postgres", "/lta_no_such_database", "does not exist"),
        ("lta_no_such_role", "/test", "does not exist"),
        ("postgres", "/test?sslmode=bogus", "sslmode"),
        ("postgres", "/test?sslmode=require", "SSL"),
        ("postgres", "/test?no_such_option=1", "no_such_option"),
    ],
)
def test_postgresql_configuration_errors_exit_78(role: str, rest: str, expected: str) -> None:
    """Unknown database or role, bad sslmode or option, TLS lacking: 78 naming database.url."""
    error = _failure(f"postgresql://{role}:{PASSWORD}@{_server()}{rest}")
    assert isinstance(error, ConfigError), error
    assert error.exit_code == 78
    assert "database.url" in str(error) and expected in str(error)
    assert PASSWORD not in f"{error} {error.hint}"


def test_closed_port_is_temporary() -> None:
    """A server that does not answer (closed port) is temporary: StorageError, exit 75."""
    error = _failure(f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/test")
    assert type(error) is StorageError and error.exit_code == 75
    assert PASSWORD not in f"{error} {error.hint}"


@pytest.mark.parametrize(
    ("sqlstate", "exit_code"),
    [
        ("3D000", 78),  # invalid_catalog_name
        ("28P01", 78),  # invalid_password
        ("28000", 78),  # invalid_authorization_specification
        ("42501", 78),  # insufficient_privilege
        ("53300", 75),  # too_many_connections
        ("57P03", 75),  # cannot_connect_now (starting up)
        ("57P01", 75),  # admin_shutdown
        ("08006", 75),  # connection_failure
        ("40001", 75),  # serialization_failure
        ("53100", 75),  # disk_full
    ],
)
def test_sqlstate_decides_first(sqlstate: str, exit_code: int) -> None:
    """With a SQLSTATE (psycopg's error of that code), its class decides 78 or 75, whatever the
    message says."""
    driver = psycopg.errors.lookup(sqlstate)('role "x" does not exist')
    exc = OperationalError("SELECT 1", {}, driver)
    assert map_driver_error(exc).exit_code == exit_code


def test_sqlite_in_a_read_only_file_is_configuration(tmp_path: Path) -> None:
    """A read-only SQLite file is 78 naming database.url with the permission hint, not temporary."""
    path = tmp_path / "lta.db"
    Store.open(f"sqlite:///{path}").close()
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.execute("CREATE TABLE t (x)")
    except sqlite3.OperationalError as driver:
        mapped = map_driver_error(OperationalError("CREATE TABLE t (x)", {}, driver))
    finally:
        conn.close()
    assert isinstance(mapped, ConfigError) and mapped.key == "database.url"
    assert "writable" in str(mapped)


def test_disk_full_is_temporary_with_the_disk_hint() -> None:
    """SQLite's "database or disk is full" is temporary (75) and says to free disk space."""
    exc = OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))
    mapped = map_driver_error(exc)
    assert type(mapped) is StorageError and "free disk space" in str(mapped)


def _not_a_database(path: Path) -> str:
    path.write_bytes(os.urandom(65536))
    return "SELECT 1"


def _damaged_pages(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 100,)] * 1000)
    damaged = bytearray(path.read_bytes())
    damaged[4096:8192] = os.urandom(4096)
    path.write_bytes(bytes(damaged))
    return "SELECT count(*), max(x) FROM t"


@pytest.mark.parametrize(
    ("make", "words", "hint"),
    [
        (_not_a_database, "is not a SQLite database", "restore it from a backup"),
        (_damaged_pages, "malformed", "PRAGMA integrity_check"),
    ],
    ids=["notadb", "corrupt"],
)
def test_a_damaged_sqlite_file_is_configuration(
    tmp_path: Path, make: Any, words: str, hint: str
) -> None:
    """A file of random bytes or damaged pages is 78 naming database.url, with the repair advice."""
    path = tmp_path / "lta.db"
    query = make(path)
    path.chmod(0o600)
    with (
        Store.open(f"sqlite:///{path}") as store,
        pytest.raises(LtaError) as info,
        store.database.read() as conn,
    ):
        conn.execute(text(query)).all()
    error = info.value
    assert isinstance(error, ConfigError) and error.key == "database.url", error
    assert words in str(error)
    if make is _not_a_database:
        assert f"{str(path)!r} is not a SQLite database" in str(error)
    assert error.hint is not None and hint in error.hint


@pytest.mark.postgres
def test_postgresql_waits_are_bounded_unless_the_url_says_otherwise() -> None:
    """PostgreSQL statements and lock waits stop at 30 s unless the URL's `options` differ."""
    url = f"postgresql://postgres@{_server()}/test"
    with Store.open(url) as store, store.database.read() as conn:
        shown = [
            conn.execute(text(f"SHOW {name}")).scalar()
            for name in ("statement_timeout", "lock_timeout")
        ]
    assert shown == ["30s", "30s"]
    with (
        Store.open(url + "?options=-c%20lock_timeout%3D1500ms") as store,
        store.database.read() as conn,
    ):
        assert conn.execute(text("SHOW lock_timeout")).scalar() == "1500ms"
