"""PostgreSQL for the benchmarks: the server's URL, throwaway databases on it, query plans.

The URL comes from `bench/run --database-url` or `LTA_BENCH_DATABASE_URL`; without it the
PostgreSQL benchmarks are skipped (with that reason in their results). Each benchmark works
in a database of its own, created on that server (`<database>_<bench>_<random>`) and dropped
at the end, so the database named by the URL is never written.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

URL_ENV = "LTA_BENCH_DATABASE_URL"
SKIP_REASON = (
    f"skipped: no PostgreSQL server (set {URL_ENV} or pass --database-url, "
    "e.g. postgresql://postgres@127.0.0.1:5432/bench)"
)


def server_url() -> str | None:
    """The PostgreSQL server's URL, or None when none was given."""
    return os.environ.get(URL_ENV) or None


def _plain(url: str) -> str:
    """The URL as psycopg takes it (no SQLAlchemy driver suffix)."""
    from sqlalchemy import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def connect(url: str, *, autocommit: bool = True) -> Any:
    """A psycopg connection to `url`."""
    import psycopg

    return psycopg.connect(_plain(url), autocommit=autocommit)


@contextmanager
def throwaway_database(url: str, tag: str) -> Iterator[str]:
    """A new empty database on `url`'s server for the block; yields its URL."""
    from psycopg import sql
    from sqlalchemy import make_url

    parsed = make_url(url)
    name = f"{parsed.database or 'lta'}_{tag}_{secrets.token_hex(3)}"
    with connect(url) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _plain(parsed.set(database=name).render_as_string(hide_password=False))
    finally:
        with connect(url) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))


def explain(conn: Any, statement: str, params: Any) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of a statement SQLAlchemy sent, in a
    transaction rolled back after (ANALYZE runs it: a claim's locks and leases are undone).

    `conn` is a SQLAlchemy connection; `statement` and `params` as its driver received them.
    """
    raw = conn.connection.driver_connection
    with raw.transaction(force_rollback=True), raw.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
        plan = cur.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return dict(plan[0])


def plan_summary(plan: dict[str, Any]) -> str:
    """One line of a plan: each node's type (and index or relation) down the tree."""
    parts: list[str] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        label = node["Node Type"]
        where = node.get("Index Name") or node.get("Relation Name")
        if where:
            label += f" on {where}"
        parts.append("  " * depth + label)
        for child in node.get("Plans", []):
            walk(child, depth + 1)

    walk(plan["Plan"], 0)
    return " / ".join(p.strip() for p in parts)
