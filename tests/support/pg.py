"""Throwaway PostgreSQL databases (`lta_test_<random>_<n>`, dropped at the end) on the server
named by LTA_TEST_DATABASE_URL."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from sqlalchemy import make_url

PG_ENV = "LTA_TEST_DATABASE_URL"
PG_SKIP = f"PostgreSQL tests need {PG_ENV} (e.g. postgresql://postgres@127.0.0.1:5432/test)"


class PgDatabases:
    """Creates throwaway databases on the server named by LTA_TEST_DATABASE_URL."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.prefix = f"lta_test_{secrets.token_hex(4)}"
        self.created: list[str] = []

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        url = make_url(self.admin_url).set(drivername="postgresql")
        return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)

    def create(self) -> str:
        """Create an empty database; return its URL (postgresql:// form)."""
        name = f"{self.prefix}_{len(self.created)}"
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        url = make_url(self.admin_url).set(drivername="postgresql", database=name)
        return url.render_as_string(hide_password=False)

    def drop_all(self) -> None:
        """Drop every database this session created."""
        with self._admin() as conn:
            for name in self.created:
                drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                conn.execute(drop.format(sql.Identifier(name)))
        self.created.clear()


@contextmanager
def throwaway_database(admin_url: str) -> Iterator[str]:
    """One empty database for the duration of the block."""
    databases = PgDatabases(admin_url)
    try:
        yield databases.create()
    finally:
        databases.drop_all()
