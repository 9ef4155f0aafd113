"""Queries of the two-phase drop (mark `dropping`, then confirm or retry the DELETE).

One DELETE at a time per user: its sender holds the user's lease, and none takes a live one.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, and_, delete, insert, select, update

from lta_worker.domain import TOKENLESS_STATES, UserRow, change_event, forgotten_event
from lta_worker.errors import UnknownUserError
from lta_worker.storage import _leases as leases
from lta_worker.storage import _outbox as outbox
from lta_worker.storage import _results as results
from lta_worker.storage._db import Queries
from lta_worker.storage._feed import record_gone
from lta_worker.storage._leases import LEASES
from lta_worker.storage._models import OutboxEvent, User
from lta_worker.storage._users import USER_COLUMNS, to_user_row


@dataclass(frozen=True, slots=True)
class DropStart:
    """The user before and after `begin_drop`; `in_flight`: another sender's DELETE is out."""

    before: UserRow
    after: UserRow
    in_flight: bool = False
    owner: str | None = None
    purged: int | None = None


# What the worker learned of a user, erased by a forget (a reused id inherits none of it).
_LEARNED = ("estimate", "plan_bucket", "rate_bucket", "last_polled_at", "last_code")


def _still(user_id: int, generation: int) -> ColumnElement[bool]:
    return and_(
        User.id == user_id,
        User.state == "dropping",
        leases.current_generation() == generation,
    )


class DropQueries(Queries):
    """The two phases of a drop, and the retries of those the service did not confirm."""

    def begin_drop(
        self,
        user: str,
        now: datetime,
        *,
        lease_until: datetime | None = None,
        purge: bool = False,
    ) -> DropStart:
        """Mark the user `dropping` (due now, a new generation), ending a pass's lease on it.

        `lease_until`: lease it to the command for its DELETE. `purge` (`users forget`):
        purge it in the same transaction, gone if and only if this write is (issue 28).
        """
        with self._db.write() as conn:
            query = select(*USER_COLUMNS).where(User.user == user).with_for_update()
            found = conn.execute(query).first()
            if found is None:
                raise UnknownUserError(user)
            before = to_user_row(found)
            purged = self._forget(conn, before, now) if purge else None
            if before.token is None or before.state in TOKENLESS_STATES:
                return DropStart(before, before, purged=purged)
            if before.state == "dropping":
                held_until = conn.execute(
                    select(LEASES.c.expires_at).where(leases.lease_of(before.id))
                ).scalar_one_or_none()
                if held_until is not None and held_until >= now:
                    return DropStart(before, before, in_flight=True, purged=purged)
            leases.end_leases(conn, leases.lease_of(before.id))
            stmt = (
                update(User)
                .where(User.id == before.id)
                .values(
                    state="dropping",
                    next_due_at=now,
                    due_class=None,
                    consecutive_failures=0,
                    generation=User.generation + 1,
                )
                .returning(*USER_COLUMNS)
            )
            after = to_user_row(conn.execute(stmt).one())
            owner = None
            if lease_until is not None:  # the command's own lease, for its DELETE
                host, pid = socket.gethostname()[:64], os.getpid()
                owner = f"{leases.DROP_OWNER_PREFIX}{host}:{pid}:{secrets.token_hex(4)}"
                conn.execute(
                    insert(LEASES).values(
                        user_id=after.id,
                        owner=owner,
                        expires_at=lease_until,
                        generation=after.generation,
                    )
                )
            reason = "forget" if purge else "drop"
            outbox.record(conn, [change_event(user, before.state, after.state, now, reason)])
        return DropStart(before, after, owner=owner, purged=purged)

    def _forget(self, conn: Connection, row: UserRow, now: datetime) -> int:
        """Purge the user's results, waiting events and learned state; how many results went."""
        purged = results.purge_user(conn, row.id)
        conn.execute(delete(OutboxEvent).where(OutboxEvent.user == row.user))
        conn.execute(
            update(User)
            .where(User.id == row.id)
            .values(forgotten_at=now, **dict.fromkeys(_LEARNED), denied={})
        )
        record_gone(conn, self._db.dialect, [row.user], "forget", now)
        state = "dropping" if row.token is not None and row.state != "dropping" else row.state
        outbox.record(conn, [forgotten_event(row.user, row.state, state, now)])
        return purged

    def finish_drop(self, user_id: int, generation: int, now: datetime) -> bool:
        """The DELETE was confirmed: `dropped`, token deleted, if still at `generation`."""
        with self._db.write() as conn:
            result = conn.execute(
                update(User)
                .where(_still(user_id, generation))
                .values(
                    state="dropped",
                    token_ciphertext=None,
                    token_key_id=None,
                    next_due_at=None,
                    due_class=None,
                    consecutive_failures=0,
                    last_outcome="dropped",
                    last_code=None,
                    dropped_at=now,
                    generation=leases.current_generation() + 1,
                )
                .returning(User.user, User.forgotten_at, User.enrolled_at)
            )
            done = result.first()
            if done is not None:
                conn.execute(delete(LEASES).where(leases.lease_of(user_id)))
                # A forget's drop unless the user enrolled again after its last forget.
                forget = done.forgotten_at is not None and (
                    done.enrolled_at is None or done.forgotten_at >= done.enrolled_at
                )
                reason = "forget" if forget else "drop"
                event = change_event(done.user, "dropping", "dropped", now, reason)
                outbox.record(conn, [event])
        return done is not None

    def defer_drop(self, user_id: int, generation: int, *, retry_at: datetime, reason: str) -> bool:
        """The DELETE was not confirmed: retried at `retry_at`, if still at `generation`."""
        with self._db.write() as conn:
            result = conn.execute(
                update(User)
                .where(_still(user_id, generation))
                .values(
                    next_due_at=retry_at,
                    consecutive_failures=User.consecutive_failures + 1,
                    last_outcome=reason,
                    generation=leases.current_generation(),
                )
            )
            if result.rowcount > 0:
                conn.execute(delete(LEASES).where(leases.lease_of(user_id)))
        return result.rowcount > 0

    def claim_drops(
        self, *, now: datetime, limit: int, owner: str, lease_until: datetime
    ) -> list[UserRow]:
        """Lease up to `limit` `dropping` users due for a DELETE retry (a new generation each)."""
        due = and_(
            User.state == "dropping",
            User.token_ciphertext.is_not(None),
            User.next_due_at.is_not(None),
            User.next_due_at <= now,
        )
        rows, _ = leases.lease_due(
            self._db, due, now=now, limit=limit, owner=owner, lease_until=lease_until
        )
        return rows
