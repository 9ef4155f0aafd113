"""B3 scale: claiming and `status` on a million users in SQLite, and the memory of a big pass.

Claim and status: 1,000,000 synthetic users (100,000 with --quick) inserted in one
statement (a recursive CTE) into a database migrated by the real code: 88 % active, 4 %
parked, 2 % unlinked, 1 % rejected, 3 % revoked and 2 % dropped (the last two without a
token); holders of a token are due spread over the hour before and after now, so about
half are due, and each holds the stored estimate of a user read 200 times (`estimate`, as
the adaptive schedule leaves it; a claim reads it back). Tokens are random bytes: nothing
is decrypted here.

- `Store.claim_due` of 1,000 users, median of several claims; between claims (untimed) the
  claimed users move an hour ahead with no lease, as `apply` would do, and the WAL is
  checkpointed, so its size after a claim is the pages the claim wrote (2,023 when the
  lease was written into each claimed user's row, before migration 0007).
- `status`: `collect_status` as the command runs it (opens the store, counts per state and
  due, last pass, budget, instances, capacity plan), median of 3; each count on its own,
  with SQLite's query plan (migration 0002's indexes came from this: before them, status
  took 1.7 s on a million users).

Memory: see `b3_memory` (a pass in a child process at two sizes).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import b3_memory
from bench.common import (
    BenchResult,
    Size,
    Workspace,
    drop_leases,
    log,
    median,
)
from lta_worker.config import PollSettings
from lta_worker.domain import ChangeEstimate, observe
from lta_worker.protocol import LONG_TERM_SCOPES

CLAIM = 1000


def stored_estimate(now: datetime) -> tuple[str, int, int]:
    """A user's stored estimate after 200 reads (some changed), and its two buckets."""
    est, cfg = ChangeEstimate(), PollSettings().policy().freshness
    for i in range(200):
        est = observe(est, f"c{i // 3}", now - timedelta(minutes=111 * (200 - i)), cfg)
    return (json.dumps(est.to_json()), *est.buckets())


def populate(db_path: Any, count: int, key_id: str, now: datetime) -> float:
    """Insert `count` synthetic users in one statement; return the seconds it took."""
    base = int(now.timestamp())
    estimate, plan_bucket, rate_bucket = stored_estimate(now)
    scopes = '["' + '", "'.join(LONG_TERM_SCOPES) + '"]'
    ts = "strftime('%Y-%m-%d %H:%M:%S', {}, 'unixepoch') || '.000000'"
    due = (
        f"CASE WHEN n % 100 < 88 THEN {ts.format(':base - 3600 + (n * 7919) % 7200')} "
        f"WHEN n % 100 < 95 THEN {ts.format(':base - 3600 + (n * 7919) % 86400')} END"
    )
    sql = f"""
        INSERT INTO users (user, state, token_ciphertext, token_key_id, scopes, denied,
                           enrolled_at, last_polled_at, next_due_at, consecutive_failures,
                           last_outcome, revoked_at, dropped_at, estimate, plan_bucket,
                           rate_bucket)
        WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n < :count - 1)
        SELECT printf('s-%08d', n),
               CASE WHEN n % 100 < 88 THEN 'active' WHEN n % 100 < 92 THEN 'parked'
                    WHEN n % 100 < 94 THEN 'unlinked' WHEN n % 100 < 95 THEN 'rejected'
                    WHEN n % 100 < 98 THEN 'revoked' ELSE 'dropped' END,
               CASE WHEN n % 100 < 95 THEN randomblob(77) END,
               CASE WHEN n % 100 < 95 THEN :key_id END,
               :scopes, '{{}}',
               {ts.format(":base - 2592000")},
               CASE WHEN n % 100 < 95 THEN {ts.format(":base - 7200 + (n * 7919) % 7200")} END,
               {due},
               0,
               CASE WHEN n % 100 < 95 THEN 'ok' ELSE NULL END,
               CASE WHEN n % 100 BETWEEN 95 AND 97 THEN {ts.format(":base - (n % 40) * 86400")} END,
               CASE WHEN n % 100 >= 98 THEN {ts.format(":base - (n % 40) * 86400")} END,
               CASE WHEN n % 100 < 95 THEN :estimate END,
               CASE WHEN n % 100 < 95 THEN :plan_bucket END,
               CASE WHEN n % 100 < 95 THEN :rate_bucket END
        FROM seq
    """  # noqa: S608 - no outside input: every value is bound or a constant
    con = sqlite3.connect(db_path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        t0 = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        params = {"count": count, "key_id": key_id, "base": base, "scopes": scopes}
        params |= {"estimate": estimate, "plan_bucket": plan_bucket, "rate_bucket": rate_bucket}
        con.execute(sql, params)
        con.execute("COMMIT")
        took = time.perf_counter() - t0
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    return took


class SqlCapture:
    """Records the SQL (and parameters) a Store sends, to replay it with sqlite3."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.statements: list[tuple[str, Any]] = []
        self._engine = engine
        self._listening = True
        event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if not statement.startswith(("BEGIN", "COMMIT", "PRAGMA")):
            self.statements.append((statement, params))

    def close(self) -> None:
        """Stop recording (idempotent)."""
        from sqlalchemy import event

        if self._listening:
            event.remove(self._engine, "before_cursor_execute", self._on_execute)
            self._listening = False


def query_plan(db_path: Any, statement: str, params: Any) -> list[str]:
    """SQLite's EXPLAIN QUERY PLAN of a statement, one line per step."""
    con = sqlite3.connect(db_path)
    try:
        rows = con.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
    finally:
        con.close()
    return [str(row[-1]) for row in rows]


def _ms(fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(1000 * (time.perf_counter() - t0))
    return times, out


def claims(
    store: Any, db_path: Any, now: datetime, runs: int, claim: int = CLAIM
) -> dict[str, Any]:
    """Time `runs` claims of `claim` users; between them, move the claimed users ahead.

    Each claim starts on an empty WAL (checkpointed between claims, untimed), so the WAL's
    size after it is what the claim wrote: its pages. Each claim's CPU time (the thread's,
    which a busy machine moves far less than the wall time) is kept too.
    """
    times: list[float] = []
    cpu: list[float] = []
    wal_pages: list[int] = []
    wal = Path(f"{db_path}-wal")
    capture = SqlCapture(store.database.engine)
    _apply_like(db_path, now + timedelta(hours=1), owner=None)
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = store.claim_due(
            now=now,
            due_before=now,
            limit=claim,
            owner="bench",
            lease_until=now + timedelta(minutes=5),
        )
        times.append(1000 * (time.perf_counter() - t0))
        cpu.append(1000 * (time.thread_time() - c0))
        wal_pages.append(wal.stat().st_size // _page_size(db_path) if wal.exists() else 0)
        if len(batch) != claim:
            raise RuntimeError(f"claimed {len(batch)} users, expected {claim}")
        capture.close()
        _apply_like(db_path, now + timedelta(hours=1))
    statement, params = capture.statements[0]
    # The same statements (the SELECT of candidates, the write of the leases) and commit
    # by sqlite3 alone: what the SQL and the commit cost, without SQLAlchemy and the
    # conversion of rows to UserRow. The commit is synced as the store's claim syncs it.
    con = sqlite3.connect(db_path, isolation_level=None)
    con.execute("PRAGMA synchronous = FULL")
    sql_times: list[float] = []
    rows: list[Any] = []
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            for replayed, replayed_params in capture.statements:
                rows = con.execute(replayed, replayed_params).fetchall() or rows
            con.execute("COMMIT")
            sql_times.append(1000 * (time.perf_counter() - t0))
            _apply_like(db_path, now + timedelta(hours=1))
    finally:
        con.close()
    return {
        "claims_ms": [round(t, 2) for t in times],
        "median_ms": median(times[1:] if len(times) > 1 else times),
        "first_ms": times[0],
        "cpu_ms": [round(t, 2) for t in cpu],
        "cpu_median_ms": median(cpu[1:] if len(cpu) > 1 else cpu),
        "wal_pages": wal_pages,
        "sql_only_median_ms": median(sql_times),
        "sql_rows": len(rows),
        "sql_statements": len(capture.statements),
        "plan": query_plan(db_path, statement, params),
    }


def _page_size(db_path: Any) -> int:
    con = sqlite3.connect(db_path)
    try:
        return int(con.execute("PRAGMA page_size").fetchone()[0])
    finally:
        con.close()


def _apply_like(db_path: Any, due: datetime, owner: str | None = "bench") -> None:
    """What `apply` does to the claimed users' schedule: due an hour later, not leased;
    then a checkpoint, so that the next claim starts on an empty WAL."""
    stamp = due.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    con = sqlite3.connect(db_path, isolation_level=None)
    try:
        names = {row[0] for row in con.execute("SELECT name FROM sqlite_master")}
        held = (
            "id IN (SELECT user_id FROM user_leases WHERE owner = 'bench')"
            if "user_leases" in names
            else "lease_owner = 'bench'"
        )
        con.execute("BEGIN IMMEDIATE")
        con.execute(f"UPDATE users SET next_due_at = ? WHERE {held}", (stamp,))  # noqa: S608
        drop_leases(con, owner)
        con.execute("COMMIT")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


def status_of(config: Any) -> dict[str, Any]:
    """`collect_status` as the `status` command calls it, from the config file."""
    from lta_worker.config import load_settings
    from lta_worker.report import collect_status

    return collect_status(load_settings(str(config), os.environ))


def status(config: Any, store: Any, db_path: Any, now: datetime) -> dict[str, Any]:
    """Time `collect_status` (median of 3), and each count alone with its query plan."""
    out: dict[str, Any] = {}
    times, data = _ms(lambda: status_of(config), 3)
    out["collect_status_ms"] = [round(t, 1) for t in times]
    out["collect_status_median_ms"] = median(times)
    out["users_by_state"] = data["users"]
    out["due"] = data["due"]
    counts: dict[str, Callable[[], Any]] = {
        "count_by_state": store.count_by_state,
        "count_due": lambda: store.count_due(now),
        "rate_buckets": store.rate_buckets,  # the adaptive plan's count (`ix_users_buckets`)
    }
    for name, fn in counts.items():
        capture = SqlCapture(store.database.engine)
        fn()
        capture.close()
        statement, params = capture.statements[0]
        times, _ = _ms(fn, 3)
        out[name] = {
            "median_ms": median(times),
            "sql": " ".join(statement.split()),
            "plan": query_plan(db_path, statement, params),
        }
    return out


def run(size: Size) -> BenchResult:
    """Run B3 and return its figures."""
    from lta_worker.storage import Store, Vault

    users = {"full": 1_000_000, "quick": 100_000, "smoke": 2_000}[size]
    claim_runs = {"full": 9, "quick": 5, "smoke": 2}[size]
    claim = 100 if size == "smoke" else CLAIM
    result = BenchResult("B3", f"scale: {users:,} users in SQLite; memory of a big pass")
    with Workspace("b3") as ws:
        base = "http://127.0.0.1:9"
        settings = ws.settings(base, base + "/auth")
        config = ws.write_config(base, base + "/auth")
        with Store.open(settings.database.url) as store:
            store.upgrade()
        key_id = Vault.from_settings(settings).current_key_id
        now = datetime.now(UTC)
        took = populate(ws.db_path, users, key_id, now)
        size_mb = ws.db_path.stat().st_size / 1024 / 1024
        log(f"B3: {users:,} synthetic users inserted in {took:.1f} s ({size_mb:.0f} MB)")
        with Store.open(settings.database.url) as store:
            status_out = status(config, store, ws.db_path, now)
            claim_out = claims(store, ws.db_path, now, claim_runs, claim)
    memory = b3_memory.measure(size)
    result.details = {
        "users": users,
        "insert_s": round(took, 2),
        "database_mb": round(size_mb, 1),
        "claim": claim_out,
        "status": status_out,
        "memory": memory,
    }
    result.add(
        f"claim_due of {claim:,} users",
        claim_out["median_ms"],
        "ms",
        at_most=20,
        note=f"median of {claim_runs - 1} after the first ({claim_out['first_ms']:.0f} ms); "
        f"CPU {claim_out['cpu_median_ms']:.1f} ms; "
        f"SQL + commit alone {claim_out['sql_only_median_ms']:.1f} ms; "
        f"{median(claim_out['wal_pages']):.0f} pages written",
    )
    result.add(
        "status (collect_status)",
        status_out["collect_status_median_ms"],
        "ms",
        at_most=1000,
        note=f"count_by_state {status_out['count_by_state']['median_ms']:.0f} ms, "
        f"count_due {status_out['count_due']['median_ms']:.0f} ms, "
        f"rate_buckets {status_out['rate_buckets']['median_ms']:.0f} ms",
    )
    small, large = memory["sizes"]
    result.add(
        f"peak RSS, pass over {large['users']:,} due users",
        large["peak_rss_mb"],
        "MB",
        at_most=150,
        note=f"{large['reads']:,} reads in {large['wall_s']:.0f} s; child process",
    )
    result.add(f"peak RSS, pass over {small['users']:,} due users", small["peak_rss_mb"], "MB")
    result.add(
        f"peak RSS ratio, {large['users'] // small['users']}x the users",
        large["peak_rss_mb"] / small["peak_rss_mb"],
        "x",
        at_most=1.1,
        note="flat in the number of users",
    )
    return result
