"""B3 on PostgreSQL: claiming and `status` on a million users, and the fleet's read rate.

The same synthetic users as B3's SQLite figures (`b3_scale.populate`: 1,000,000, or
100,000 with --quick; 88 % active, 4 % parked, 2 % unlinked, 1 % rejected, 3 % revoked and
2 % dropped; about half due), inserted in one `INSERT ... SELECT generate_series` into a
database of its own migrated by the real code, then `ANALYZE`d (as autovacuum would after
such a load; the planner has no statistics before).

- `Store.claim_due` of 1,000 users, median of several after the first; between claims
  (untimed) the claimed users move an hour ahead and their leases go, as `apply` would do.
  The plan of each statement of the claim (one: the candidates `FOR UPDATE SKIP LOCKED`,
  the upsert of their leases, the rows won): EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON), in a
  transaction rolled back.
- `status`: `collect_status` as the command runs it, median of 3; each count alone, with
  its plan.
- The fleet: see `b3_fleet` (1, 2 and 4 `lta-worker run` processes at an unlimited budget).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import b3_fleet, pg
from bench.b3_scale import CLAIM, SqlCapture, status_of
from bench.common import BenchResult, Size, Workspace, log, median
from lta_worker.protocol import LONG_TERM_SCOPES


def populate(url: str, count: int, key_id: str, now: datetime) -> float:
    """Insert `count` synthetic users in one statement, then ANALYZE; return the seconds."""
    scopes = '["' + '", "'.join(LONG_TERM_SCOPES) + '"]'
    ts = "to_timestamp({})"
    due = (
        f"CASE WHEN n % 100 < 88 THEN {ts.format('%(base)s - 3600 + (n * 7919) % 7200')} "
        f"WHEN n % 100 < 95 THEN {ts.format('%(base)s - 3600 + (n * 7919) % 86400')} END"
    )
    sql = f"""
        INSERT INTO users ("user", state, token_ciphertext, token_key_id, scopes, denied,
                           enrolled_at, last_polled_at, next_due_at, consecutive_failures,
                           last_outcome, revoked_at, dropped_at)
        SELECT 's-' || lpad(n::text, 8, '0'),
               CASE WHEN n % 100 < 88 THEN 'active' WHEN n % 100 < 92 THEN 'parked'
                    WHEN n % 100 < 94 THEN 'unlinked' WHEN n % 100 < 95 THEN 'rejected'
                    WHEN n % 100 < 98 THEN 'revoked' ELSE 'dropped' END,
               CASE WHEN n % 100 < 95
                    THEN sha512(int8send(n)) || sha256(int8send(n)) || '\\x0102030405'::bytea
               END,
               CASE WHEN n % 100 < 95 THEN %(key_id)s END,
               %(scopes)s::json, '{{}}'::json,
               {ts.format("%(base)s - 2592000")},
               CASE WHEN n % 100 < 95 THEN {ts.format("%(base)s - 7200 + (n * 7919) % 7200")}
               END,
               {due},
               0,
               CASE WHEN n % 100 < 95 THEN 'ok' END,
               CASE WHEN n % 100 BETWEEN 95 AND 97 THEN {ts.format("%(base)s - (n % 40) * 86400")}
               END,
               CASE WHEN n % 100 >= 98 THEN {ts.format("%(base)s - (n % 40) * 86400")} END
        FROM generate_series(0::bigint, %(count)s - 1) AS n
    """  # noqa: S608 - no outside input: every value is bound or a constant
    sql = sql.replace(" % ", " %% ")  # the modulo, not a placeholder
    params = {"count": count, "key_id": key_id, "base": int(now.timestamp()), "scopes": scopes}
    with pg.connect(url) as con:
        t0 = time.perf_counter()
        con.execute(sql, params)
        con.execute("ANALYZE users")
        took = time.perf_counter() - t0
    return took


def _apply_like(url: str, due: datetime) -> None:
    """What `apply` does to the claimed users: due an hour later, their leases gone."""
    with pg.connect(url, autocommit=False) as con:
        con.execute(
            "UPDATE users SET next_due_at = %s, generation = generation + 1 "
            "WHERE id IN (SELECT user_id FROM user_leases WHERE owner = 'bench')",
            (due,),
        )
        con.execute("DELETE FROM user_leases WHERE owner = 'bench'")
        con.commit()


def claims(store: Any, url: str, now: datetime, runs: int, claim: int) -> dict[str, Any]:
    """Time `runs` claims of `claim` users (moving them ahead between claims); the plans."""
    times: list[float] = []
    cpu: list[float] = []
    capture = SqlCapture(store.database.engine)
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
        if len(batch) != claim:
            raise RuntimeError(f"claimed {len(batch)} users, expected {claim}")
        capture.close()
        _apply_like(url, now + timedelta(hours=1))
    plans = []
    with store.database.engine.connect() as conn:
        for statement, params in capture.statements:
            plan = pg.explain(conn, statement, params)
            plans.append(
                {
                    "sql": " ".join(statement.split())[:400],
                    "execution_ms": plan.get("Execution Time"),
                    "planning_ms": plan.get("Planning Time"),
                    "summary": pg.plan_summary(plan),
                    "plan": plan,
                }
            )
    _apply_like(url, now + timedelta(hours=1))
    return {
        "claims_ms": [round(t, 2) for t in times],
        "median_ms": median(times[1:] if len(times) > 1 else times),
        "first_ms": times[0],
        "cpu_ms": [round(t, 2) for t in cpu],
        "cpu_median_ms": median(cpu[1:] if len(cpu) > 1 else cpu),
        "statements": plans,
    }


def _ms(fn: Callable[[], Any], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return times


class StatementTimer:
    """Every statement any engine sends while it listens, with its time (until closed)."""

    def __init__(self) -> None:
        from sqlalchemy import Engine, event

        self.statements: list[dict[str, Any]] = []
        self._started: list[float] = []
        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)

    def _before(self, *_: Any) -> None:
        self._started.append(time.perf_counter())

    def _after(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        took = 1000 * (time.perf_counter() - self._started.pop())
        self.statements.append({"sql": statement, "params": params, "ms": took})

    def close(self) -> None:
        """Stop listening."""
        from sqlalchemy import Engine, event

        event.remove(Engine, "before_cursor_execute", self._before)
        event.remove(Engine, "after_cursor_execute", self._after)


def status_statements(config: Any, store: Any) -> list[dict[str, Any]]:
    """The statements of one `collect_status` over 5 ms, slowest first, each with its plan."""
    timer = StatementTimer()
    try:
        status_of(config)
    finally:
        timer.close()
    slow = sorted((s for s in timer.statements if s["ms"] > 5), key=lambda s: -s["ms"])
    out = []
    with store.database.engine.connect() as conn:
        for found in slow:
            plan = pg.explain(conn, found["sql"], found["params"])
            out.append(
                {
                    "sql": " ".join(found["sql"].split())[:400],
                    "ms": round(found["ms"], 1),
                    "summary": pg.plan_summary(plan),
                    "plan": plan,
                }
            )
    return out


def status(config: Any, store: Any, now: datetime) -> dict[str, Any]:
    """Time `collect_status` (median of 3), its slow statements, each count alone with its
    plan."""
    out: dict[str, Any] = {}
    times = _ms(lambda: status_of(config), 3)
    data = status_of(config)
    out["statements"] = status_statements(config, store)
    out["collect_status_ms"] = [round(t, 1) for t in times]
    out["collect_status_median_ms"] = median(times)
    out["users_by_state"] = data["users"]
    out["due"] = data["due"]
    counts: dict[str, Callable[[], Any]] = {
        "count_by_state": store.count_by_state,
        "count_due": lambda: store.count_due(now),
    }
    for name, fn in counts.items():
        capture = SqlCapture(store.database.engine)
        fn()
        capture.close()
        statement, params = capture.statements[0]
        with store.database.engine.connect() as conn:
            plan = pg.explain(conn, statement, params)
        out[name] = {
            "median_ms": median(_ms(fn, 3)),
            "sql": " ".join(statement.split()),
            "execution_ms": plan.get("Execution Time"),
            "summary": pg.plan_summary(plan),
            "plan": plan,
        }
    return out


def scale(url: str, size: Size) -> dict[str, Any]:
    """Populate a database of its own on `url`'s server; the claim and status figures."""
    from lta_worker.storage import Store, Vault

    users = {"full": 1_000_000, "quick": 100_000, "smoke": 2_000}[size]
    claim_runs = {"full": 9, "quick": 5, "smoke": 2}[size]
    claim = 100 if size == "smoke" else CLAIM
    with Workspace("b3pg") as ws, pg.throwaway_database(url, "b3pg") as db_url:
        base = "http://127.0.0.1:9"
        settings = ws.settings(base, base + "/auth", database={"url": db_url})
        config = ws.write_config(base, base + "/auth", database={"url": db_url})
        with Store.open(db_url) as store:
            store.upgrade()
        key_id = Vault.from_settings(settings).current_key_id
        now = datetime.now(UTC)
        took = populate(db_url, users, key_id, now)
        with pg.connect(db_url) as con:
            row = con.execute("SELECT pg_total_relation_size('users')").fetchone()
        size_mb = row[0] / 1024 / 1024
        log(f"B3PG: {users:,} synthetic users inserted in {took:.1f} s ({size_mb:.0f} MB)")
        with Store.open(db_url) as store:
            status_out = status(config, store, now)
            claim_out = claims(store, db_url, now, claim_runs, claim)
    return {
        "users": users,
        "claim_size": claim,
        "claim_runs": claim_runs,
        "insert_s": round(took, 2),
        "users_table_mb": round(size_mb, 1),
        "claim": claim_out,
        "status": status_out,
    }


def _slow_note(statements: list[dict[str, Any]]) -> str:
    if not statements:
        return "no statement over 5 ms"
    shown = [f"{s['ms']:.0f} ms ({s['summary']})" for s in statements]
    return f"{len(statements)} statements over 5 ms: " + ", ".join(shown)


def run(size: Size) -> BenchResult:
    """Run B3 on PostgreSQL (skipped, saying why, without a server) and return its figures."""
    result = BenchResult("B3PG", "scale on PostgreSQL: claim and status; the fleet's reads/s")
    url = pg.server_url()
    if url is None:
        result.add("skipped", "no server", note=pg.SKIP_REASON)
        result.details["skipped"] = pg.SKIP_REASON
        return result
    out = scale(url, size)
    result.details.update(out)
    claim_out, status_out = out["claim"], out["status"]
    users, claim, runs = out["users"], out["claim_size"], out["claim_runs"]
    result.add(
        f"claim_due of {claim:,} users out of {users:,}",
        claim_out["median_ms"],
        "ms",
        at_most=20,
        note=f"median of {runs - 1} after the first ({claim_out['first_ms']:.0f} ms); "
        f"CPU {claim_out['cpu_median_ms']:.1f} ms; statements in the server "
        + ", ".join(f"{s['execution_ms']:.1f}" for s in claim_out["statements"])
        + " ms",
    )
    result.add(
        f"status (collect_status), {users:,} users",
        status_out["collect_status_median_ms"],
        "ms",
        at_most=1000,
        note=_slow_note(status_out["statements"]),
    )
    fleet = b3_fleet.measure(url, size)
    result.details["fleet"] = fleet
    b3_fleet.add_figures(result, fleet)
    return result
