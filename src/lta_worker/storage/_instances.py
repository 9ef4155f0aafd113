"""Instances (several processes sharing one database), pass summaries and the client budget."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, Executable, Row, delete, insert, select, update

from lta_worker.domain import BudgetSeen, InstanceKind, InstanceRow, PassRecord
from lta_worker.storage import _leases as leases
from lta_worker.storage._db import Database
from lta_worker.storage._models import ClientBudget, Instance, Pass

PASSES_KEPT = 1000
"""How many pass summaries are kept; older ones are deleted as new ones are recorded."""

"""Given the last observation and the permits reserved since, how many may be handed out."""

T = TypeVar("T")
BudgetFn = Callable[[BudgetSeen | None, int], tuple[BudgetSeen | None, int, T]]
"""Given the row's observation (None: no row) and `reserved`, their new values and a result."""


def _upsert(
    db: Database,
    model: type[Instance] | type[ClientBudget],
    values: dict[str, Any],
    set_: dict[str, Any],
    where: ColumnElement[bool] | None = None,
) -> Executable:
    key = ["instance_id"] if model is Instance else ["client_id"]
    if db.dialect == "postgresql":
        from sqlalchemy.dialects import postgresql  # imported here: slow to import

        pg = postgresql.insert(model).values(values)
        return pg.on_conflict_do_update(index_elements=key, set_=set_, where=where)
    from sqlalchemy.dialects import sqlite

    lite = sqlite.insert(model).values(values)
    return lite.on_conflict_do_update(index_elements=key, set_=set_, where=where)


def _insert_missing(db: Database, values: dict[str, Any]) -> Executable:
    """INSERT the budget row unless one exists, RETURNING its key (no row: it existed)."""
    if db.dialect == "postgresql":
        from sqlalchemy.dialects import postgresql  # imported here: slow to import

        pg = postgresql.insert(ClientBudget).values(values).on_conflict_do_nothing()
        return pg.returning(ClientBudget.client_id)
    from sqlalchemy.dialects import sqlite

    lite = sqlite.insert(ClientBudget).values(values).on_conflict_do_nothing()
    return lite.returning(ClientBudget.client_id)


def register_instance(
    db: Database,
    instance: str,
    kind: InstanceKind,
    now: datetime,
    *,
    host: str | None = None,
    pid: int | None = None,
) -> None:
    """Record (or refresh) this process as a live instance."""
    values = {
        "host": host if host is not None else socket.gethostname(),
        "pid": pid if pid is not None else os.getpid(),
        "kind": kind,
        "started_at": now,
        "heartbeat_at": now,
    }
    stmt = _upsert(db, Instance, {"instance_id": instance, **values}, values)
    with db.write() as conn:
        conn.execute(stmt)


def heartbeat(db: Database, instance: str, now: datetime) -> bool:
    """Mark the instance alive at `now`; False when it is not registered (re-register it)."""
    with db.write() as conn:
        stmt = update(Instance).where(Instance.instance_id == instance)
        return conn.execute(stmt.values(heartbeat_at=now)).rowcount == 1


def live_instances(db: Database, now: datetime, ttl: timedelta) -> list[InstanceRow]:
    """Instances whose last heartbeat is within `ttl` of `now`, oldest start first."""
    with db.read() as conn:
        rows = conn.execute(
            select(Instance)
            .where(Instance.heartbeat_at >= now - ttl)
            .order_by(Instance.started_at, Instance.instance_id)
        ).all()
    return [
        InstanceRow(
            instance=r.instance_id,
            host=r.host,
            pid=r.pid,
            kind=cast(InstanceKind, r.kind),
            started_at=r.started_at,
            heartbeat_at=r.heartbeat_at,
        )
        for r in rows
    ]


def unregister(db: Database, instance: str) -> None:
    """Forget the instance and drop the leases it holds (owner = instance id)."""
    with db.write() as conn:
        conn.execute(delete(Instance).where(Instance.instance_id == instance))
        leases.end_leases(conn, leases.owned_by(instance))


def prune_instances(db: Database, now: datetime, ttl: timedelta) -> int:
    """Delete instances silent for longer than `ttl`; return how many."""
    with db.write() as conn:
        return conn.execute(delete(Instance).where(Instance.heartbeat_at < now - ttl)).rowcount


def record_pass(db: Database, record: PassRecord) -> None:
    """Store a pass summary; keep the newest `PASSES_KEPT`."""
    with db.write() as conn:
        new_id = conn.execute(
            insert(Pass)
            .values(
                instance=record.instance,
                started_at=record.started_at,
                finished_at=record.finished_at,
                stopped=record.stopped,
                exit_code=record.exit_code,
                reads=record.reads,
                throttled=record.throttled,
                counts=dict(record.counts),
            )
            .returning(Pass.id)
        ).scalar_one()
        conn.execute(delete(Pass).where(Pass.id <= new_id - PASSES_KEPT))


def last_pass(
    db: Database,
    stopped: str | None = None,
    *,
    first: bool = False,
    read: bool = False,
    answered: bool = False,
) -> PassRecord | None:
    """The summary of the pass that finished last (`first`: the oldest kept) of those that
    stopped as `stopped` (any when None), made reads (`read`), or had reads the service
    answered (`answered`: `PassRecord.answered`), or None."""
    order = (Pass.finished_at, Pass.id) if first else (Pass.finished_at.desc(), Pass.id.desc())
    query = select(Pass).order_by(*order)
    if stopped is not None:
        query = query.where(Pass.stopped == stopped)
    if read or answered:
        query = query.where(Pass.reads > 0)
    with db.read() as conn:
        if not answered:
            row = conn.execute(query.limit(1)).first()
            return None if row is None else _pass_record(row)
        # The outcome counts are JSON, read alike on every backend: the newest passes with
        # reads are looked at in turn (usually the first one answers; at most those kept).
        for row in conn.execute(query.limit(PASSES_KEPT)):
            record = _pass_record(row)
            if record.answered:
                return record
    return None


def _pass_record(row: Row[Any]) -> PassRecord:
    return PassRecord(
        instance=row.instance,
        started_at=row.started_at,
        finished_at=row.finished_at,
        stopped=row.stopped,
        exit_code=row.exit_code,
        reads=row.reads,
        throttled=row.throttled,
        counts={str(k): int(v) for k, v in (row.counts or {}).items()},
    )


def record_budget(db: Database, client_id: str, seen: BudgetSeen) -> None:
    """Store what the service reported about the budget; `reserved` restarts at 0.

    An observation older than the stored one (another instance saw a newer answer) is
    ignored.
    """
    values = {
        "limit": seen.limit,
        "remaining": seen.remaining,
        "reset_at": seen.reset_at,
        "window_seconds": seen.window_seconds,
        "observed_at": seen.observed_at,
        "reserved": 0,
    }
    stmt = _upsert(
        db,
        ClientBudget,
        {"client_id": client_id, **values},
        values,
        where=ClientBudget.observed_at <= seen.observed_at,
    )
    with db.write() as conn:
        conn.execute(stmt)


def _seen(row: Row[Any]) -> BudgetSeen:
    return BudgetSeen(
        limit=row.limit,
        remaining=row.remaining,
        reset_at=row.reset_at,
        window_seconds=row.window_seconds,
        observed_at=row.observed_at,
    )


def budget_seen(db: Database, client_id: str) -> BudgetSeen | None:
    """What the service last reported about `client_id`'s budget, or None."""
    with db.read() as conn:
        row = conn.execute(select(ClientBudget).where(ClientBudget.client_id == client_id)).first()
    return _seen(row) if row is not None else None


def update_budget(db: Database, client_id: str, fn: BudgetFn[T]) -> T:
    """Read the client's budget row under a lock, let `fn` decide, write back; one transaction.

    `fn` gets the row's observation (None when there is no row yet) and `reserved`, and
    returns their new values and a result, which is returned. The row is locked (FOR UPDATE
    on PostgreSQL, BEGIN IMMEDIATE on SQLite), so concurrent callers see each other's
    writes. A missing row is created when `fn` returns an observation; when another caller
    created it meanwhile, `fn` runs again on that row.
    """
    query = select(ClientBudget).where(ClientBudget.client_id == client_id)
    if db.dialect == "postgresql":
        query = query.with_for_update()
    while True:
        with db.write() as conn:
            row = conn.execute(query).first()
            before = (_seen(row), row.reserved) if row is not None else (None, 0)
            seen, reserved, result = fn(*before)
            if seen is None or (seen, reserved) == before:
                return result
            values = {
                "limit": seen.limit,
                "remaining": seen.remaining,
                "reset_at": seen.reset_at,
                "window_seconds": seen.window_seconds,
                "observed_at": seen.observed_at,
                "reserved": reserved,
            }
            if row is not None:
                conn.execute(
                    update(ClientBudget).where(ClientBudget.client_id == client_id).values(values)
                )
                return result
            created = _insert_missing(db, {"client_id": client_id, **values})
            if conn.execute(created).first() is not None:
                return result
        # Another caller created the row between our read and our insert: decide again.
