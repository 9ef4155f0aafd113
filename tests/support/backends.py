"""Fixtures (a pytest plugin of tests/conftest.py): a migrated `store` over every backend, and
empty databases for migration tests. PostgreSQL runs when LTA_TEST_DATABASE_URL names a server;
each session uses its own throwaway databases, so concurrent runs never collide."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from lta_worker.storage import HEAD_REVISION, Store
from support.pg import PG_ENV, PG_SKIP, PgDatabases

TABLES = (
    "users, user_leases, snapshots, history, pending_enrollments, instances, client_budget, "
    "passes, webhook_outbox, feed_gone"
)


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[PgDatabases | None]:
    """The throwaway-database factory, or None without LTA_TEST_DATABASE_URL."""
    admin = os.environ.get(PG_ENV)
    if not admin:
        yield None
        return
    databases = PgDatabases(admin)
    try:
        yield databases
    finally:
        databases.drop_all()


@pytest.fixture(scope="session")
def pg_store_url(pg_databases: PgDatabases | None) -> str | None:
    """A migrated PostgreSQL database shared by the session (tables emptied per test)."""
    if pg_databases is None:
        return None
    url = pg_databases.create()
    with Store.open(url) as store:
        store.upgrade()
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, copied for each test."""
    path = tmp_path_factory.mktemp("template") / "lta.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.upgrade()
    return path


@pytest.fixture
def sqlite_store(tmp_path: Path, sqlite_template: Path) -> Iterator[Store]:
    """A migrated SQLite store in tmp_path (a copy of the template), closed after the test."""
    path = tmp_path / "lta.db"
    path.write_bytes(sqlite_template.read_bytes())
    path.chmod(0o600)
    with Store.open(f"sqlite:///{path}") as store:
        yield store


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test; PostgreSQL is skipped (with the reason) when not configured."""
    if request.param == "postgresql" and not os.environ.get(PG_ENV):
        pytest.skip(PG_SKIP)
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, sqlite_template: Path, pg_store_url: str | None) -> str:
    """The URL of an empty, migrated database of `backend`."""
    if backend == "sqlite":
        path = tmp_path / "db" / "lta.db"
        path.parent.mkdir()
        shutil.copyfile(sqlite_template, path)
        path.chmod(0o600)
        return f"sqlite:///{path}"
    assert pg_store_url is not None
    with psycopg.connect(pg_store_url, autocommit=True) as conn:
        conn.execute(sql.SQL(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
        conn.execute("UPDATE alembic_version SET version_num = %s", (HEAD_REVISION,))
    return pg_store_url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open Store over an empty, migrated database; closed after the test."""
    with Store.open(store_url) as opened:
        yield opened


@pytest.fixture
def empty_url(backend: str, tmp_path: Path, pg_databases: PgDatabases | None) -> str:
    """The URL of a database with no schema at all (SQLite: the file does not exist yet)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh' / 'lta.db'}"
    assert pg_databases is not None
    return pg_databases.create()
