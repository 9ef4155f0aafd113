"""Queries of the two-phase drop: mark a user `dropping`, then confirm or retry the DELETE.

`users drop` / `users forget` first mark the user `dropping` (bumping its generation, so a
running pass's decision about it is discarded), keep the token only to send the DELETE,
and delete it only once the service confirmed. A drop the service did not confirm stays
`dropping`, due for a retry at `next_due_at`, and `run` / `serve` retry it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, delete, select, update

from lta_worker.domain import TOKENLESS_STATES, UserRow, change_event
from lta_worker.errors import UnknownUserError
from lta_worker.storage import _leases as leases
from lta_worker.storage import _outbox as outbox
from lta_worker.storage._db import Database
from lta_worker.storage._leases import LEASES, USERS
from lta_worker.storage._models import User
from lta_worker.storage._users import USER_COLUMNS, to_user_row


@dataclass(frozen=True, slots=True)
class DropStart:
    """The user before `begin_drop` and after it (the same row when nothing changed)."""

    before: UserRow
    after: UserRow


def begin_drop(db: Database, user: str, now: datetime) -> DropStart:
    """Mark the user `dropping` (due for a DELETE now) and bump its generation.

    A user without a token (revoked, dropped) is left exactly as it is: no relabel, no
    retention clock restart. A user already `dropping` gets a new generation and is due
    now (the command retries the DELETE itself).

    Raises:
        UnknownUserError: no such user.
    """
    with db.write() as conn:
        query = select(*USER_COLUMNS).where(User.user == user)
        if db.dialect == "postgresql":
            query = query.with_for_update()
        found = conn.execute(query).first()
        if found is None:
            raise UnknownUserError(user)
        before = to_user_row(found)
        if before.token is None or before.state in TOKENLESS_STATES:
            return DropStart(before, before)
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
        outbox.record(conn, [change_event(user, before.state, after.state, now, "drop")])
    return DropStart(before, after)


def finish_drop(db: Database, user_id: int, generation: int, now: datetime) -> bool:
    """The service confirmed the DELETE: delete the token, state `dropped`; True if written.

    Written only while the row is still `dropping` with `generation`: a user re-enrolled
    since (a new token) keeps it.
    """
    with db.write() as conn:
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
            .returning(User.user)
        )
        user = result.scalar_one_or_none()
        if user is not None:
            conn.execute(delete(LEASES).where(leases.lease_of(user_id)))
            outbox.record(conn, [change_event(user, "dropping", "dropped", now, "drop")])
    return user is not None


def defer_drop(
    db: Database, user_id: int, generation: int, *, retry_at: datetime, reason: str
) -> bool:
    """The DELETE was not confirmed: stay `dropping`, retried at `retry_at`; True if written."""
    with db.write() as conn:
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
    db: Database, *, now: datetime, limit: int, owner: str, lease_until: datetime
) -> list[UserRow]:
    """Lease up to `limit` `dropping` users due for a DELETE retry (a new generation each)."""
    due = and_(
        User.state == "dropping",
        User.token_ciphertext.is_not(None),
        User.next_due_at.is_not(None),
        User.next_due_at <= now,
    )
    order = (USERS.c.next_due_at, USERS.c.id)
    rows, _ = leases.lease_due(
        db, due, order, now=now, limit=limit, owner=owner, lease_until=lease_until
    )
    return rows


def _still(user_id: int, generation: int) -> ColumnElement[bool]:
    return and_(
        User.id == user_id,
        User.state == "dropping",
        leases.current_generation() == generation,
    )
