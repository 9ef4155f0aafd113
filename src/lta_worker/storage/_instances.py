"""Instances (several processes sharing one database), pass summaries and the client budget."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from sqlalchemy import Row, delete, insert, select, update

from lta_worker.domain import BudgetSeen, InstanceKind, InstanceRow, PassRecord
from lta_worker.storage import _leases as leases
from lta_worker.storage._db import Queries, insert_for
from lta_worker.storage._models import ClientBudget, Instance, Pass

PASSES_KEPT = 1000  # pass summaries kept; older ones go as new ones are recorded

T = TypeVar("T")
BudgetFn = Callable[[BudgetSeen | None, int], tuple[BudgetSeen | None, int, T]]

# A column per field of `BudgetSeen` (the budget row) and of `PassRecord` (a pass's row).
_SEEN: Final = tuple(field.name for field in fields(BudgetSeen))
_PASS: Final = tuple(field.name for field in fields(PassRecord))


def _budget_values(seen: BudgetSeen, reserved: int) -> dict[str, Any]:
    return {**{name: getattr(seen, name) for name in _SEEN}, "reserved": reserved}


def _seen(row: Row[Any]) -> BudgetSeen:
    return BudgetSeen(*(getattr(row, name) for name in _SEEN))


def _pass_record(row: Row[Any]) -> PassRecord:
    counts = {str(k): int(v) for k, v in (row.counts or {}).items()}
    return PassRecord(**{**{name: getattr(row, name) for name in _PASS}, "counts": counts})


class InstanceQueries(Queries):
    """Live instances, pass summaries, and the client's budget as the service reported it."""

    def register_instance(self, instance: str, kind: InstanceKind, now: datetime) -> None:
        """Record (or refresh) this process as a live instance."""
        values = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "kind": kind,
            "started_at": now,
            "heartbeat_at": now,
        }
        stmt = insert_for(self._db.dialect, Instance).values(instance_id=instance, **values)
        with self._db.write() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=["instance_id"], set_=values))

    def heartbeat(self, instance: str, now: datetime) -> bool:
        """Mark the instance alive at `now`; False when it is not registered (re-register it)."""
        with self._db.write() as conn:
            stmt = update(Instance).where(Instance.instance_id == instance)
            return conn.execute(stmt.values(heartbeat_at=now)).rowcount == 1

    def live_instances(self, now: datetime, ttl: timedelta) -> list[InstanceRow]:
        """Instances whose last heartbeat is within `ttl` of `now`, oldest start first."""
        with self._db.read() as conn:
            rows: Sequence[Row[Any]] = conn.execute(
                select(Instance)
                .where(Instance.heartbeat_at >= now - ttl)
                .order_by(Instance.started_at, Instance.instance_id)
            ).all()
        return [
            InstanceRow(r.instance_id, r.host, r.pid, r.kind, r.started_at, r.heartbeat_at)
            for r in rows
        ]

    def unregister(self, instance: str) -> None:
        """Forget the instance and drop the leases it holds (owner = instance id)."""
        with self._db.write() as conn:
            conn.execute(delete(Instance).where(Instance.instance_id == instance))
            leases.end_leases(conn, leases.owned_by(instance))

    def prune_instances(self, now: datetime, ttl: timedelta) -> int:
        """Delete instances silent for longer than `ttl`; return how many."""
        with self._db.write() as conn:
            stmt = delete(Instance).where(Instance.heartbeat_at < now - ttl)
            return conn.execute(stmt).rowcount

    def record_pass(self, record: PassRecord) -> None:
        """Store a pass summary; keep the newest `PASSES_KEPT`."""
        with self._db.write() as conn:
            values = {name: getattr(record, name) for name in _PASS}
            values["counts"] = dict(record.counts)
            new_id = conn.execute(insert(Pass).values(values).returning(Pass.id)).scalar_one()
            conn.execute(delete(Pass).where(Pass.id <= new_id - PASSES_KEPT))

    def last_pass(
        self,
        *,
        first: bool = False,
        read: bool = False,
        answered: bool = False,
        stopped: str | None = None,
    ) -> PassRecord | None:
        """The summary of the pass that finished last (`first`: the oldest kept), that made
        reads (`read`), had answered reads (`answered`) or stopped as `stopped`; or None."""
        order = (Pass.finished_at, Pass.id) if first else (Pass.finished_at.desc(), Pass.id.desc())
        query = select(Pass).order_by(*order)
        if stopped is not None:
            query = query.where(Pass.stopped == stopped)
        if read or answered:
            query = query.where(Pass.reads > 0)
        with self._db.read() as conn:
            if not answered:
                row = conn.execute(query.limit(1)).first()
                return None if row is None else _pass_record(row)
            # The counts are JSON: the newest passes with reads are looked at in turn.
            for row in conn.execute(query.limit(PASSES_KEPT)):
                record = _pass_record(row)
                if record.answered:
                    return record
        return None

    def record_budget(self, client_id: str, seen: BudgetSeen) -> None:
        """Store the budget the service reported (unless older); `reserved` restarts at 0."""
        values = _budget_values(seen, 0)
        stmt = insert_for(self._db.dialect, ClientBudget).values(client_id=client_id, **values)
        stmt = stmt.on_conflict_do_update(
            index_elements=["client_id"],
            set_=values,
            where=ClientBudget.observed_at <= seen.observed_at,
        )
        with self._db.write() as conn:
            conn.execute(stmt)

    def budget_seen(self, client_id: str) -> BudgetSeen | None:
        """What the service last reported about `client_id`'s budget, or None."""
        query = select(ClientBudget).where(ClientBudget.client_id == client_id)
        with self._db.read() as conn:
            row = conn.execute(query).first()
        return _seen(row) if row is not None else None

    def update_budget(self, client_id: str, fn: BudgetFn[T]) -> T:
        """`fn(seen or None, reserved) -> (seen, reserved, result)` on the client's budget row,
        locked, in one transaction; again when another caller created the row meanwhile."""
        query = select(ClientBudget).where(ClientBudget.client_id == client_id).with_for_update()
        while True:
            with self._db.write() as conn:
                row = conn.execute(query).first()
                before = (_seen(row), row.reserved) if row is not None else (None, 0)
                seen, reserved, result = fn(*before)
                if seen is None or (seen, reserved) == before:
                    return result
                values = _budget_values(seen, reserved)
                if row is not None:
                    conn.execute(
                        update(ClientBudget)
                        .where(ClientBudget.client_id == client_id)
                        .values(values)
                    )
                    return result
                created = insert_for(self._db.dialect, ClientBudget).values(
                    client_id=client_id, **values
                )
                created = created.on_conflict_do_nothing().returning(ClientBudget.client_id)
                if conn.execute(created).first() is not None:
                    return result
            # Another caller created the row between our read and our insert: decide again.
