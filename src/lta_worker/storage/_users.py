"""Queries on users: read, claim due users under a lease, apply turns, store and delete tokens.

Every state change queues its webhook event in its own transaction (`_outbox`).

Just over the ~400-line ceiling: every query of the `users` table stays in one module; the
batched write of a pass's turns is `_apply`, the claim's row mapping `_rows`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Executable,
    Row,
    and_,
    func,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import InterfaceError, OperationalError

from lta_worker.domain import (
    ANSWERED_KINDS,
    FAILED_KINDS,
    TOKENLESS_STATES,
    USER_STATES,
    ChangeEstimate,
    EncryptedToken,
    ReadHealth,
    ResultEvents,
    UserRow,
    UserState,
    UserUpdate,
    change_event,
    enrollment_event,
)
from lta_worker.errors import UnknownUserError
from lta_worker.storage import _leases as leases
from lta_worker.storage import _outbox as outbox
from lta_worker.storage._apply import USERS, without_repeats, write_batch
from lta_worker.storage._db import Database
from lta_worker.storage._models import User, UtcDateTime

USER_COLUMNS = (
    User.id,
    User.user,
    User.state,
    User.token_ciphertext,
    User.token_key_id,
    User.scopes,
    User.denied,
    User.enrolled_at,
    User.last_polled_at,
    User.next_due_at,
    User.consecutive_failures,
    User.last_outcome,
    User.last_code,
    leases.current_generation().label("generation"),
    User.estimate,
)


def _denied_out(raw: Mapping[str, Any] | None) -> dict[str, datetime]:
    out: dict[str, datetime] = {}
    for endpoint, value in (raw or {}).items():
        stamp = datetime.fromisoformat(str(value))
        out[endpoint] = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    return out


def to_user_row(row: Row[Any]) -> UserRow:
    """Turn a row of `USER_COLUMNS` into a UserRow."""
    token = (
        EncryptedToken(ciphertext=bytes(row.token_ciphertext), key_id=row.token_key_id)
        if row.token_ciphertext is not None
        else None
    )
    return UserRow(
        id=row.id,
        user=row.user,
        state=cast(UserState, row.state),
        token=token,
        scopes=tuple(row.scopes or ()),
        denied=_denied_out(row.denied),
        enrolled_at=row.enrolled_at,
        last_polled_at=row.last_polled_at,
        next_due_at=row.next_due_at,
        consecutive_failures=row.consecutive_failures,
        last_outcome=row.last_outcome,
        last_code=row.last_code,
        generation=row.generation,
        estimate=ChangeEstimate.from_json(row.estimate) if row.estimate else None,
    )


def get_user(db: Database, user: str) -> UserRow | None:
    """The user with the client's user id `user`, or None."""
    with db.read() as conn:
        row = conn.execute(select(*USER_COLUMNS).where(User.user == user)).first()
    return to_user_row(row) if row is not None else None


def list_users(db: Database, batch: int = 500) -> Iterator[UserRow]:
    """Every user in id order, read in keyset batches (one short transaction per batch)."""
    after = 0
    while True:
        with db.read() as conn:
            rows = conn.execute(
                select(*USER_COLUMNS).where(User.id > after).order_by(User.id).limit(batch)
            ).all()
        if not rows:
            return
        for row in rows:
            yield to_user_row(row)
        after = rows[-1].id


def count_by_state(db: Database) -> dict[str, int]:
    """Users per state; every state is present (0 when none)."""
    counts: dict[str, int] = dict.fromkeys(USER_STATES, 0)
    with db.read() as conn:
        for state, count in conn.execute(select(User.state, func.count()).group_by(User.state)):
            counts[state] = count
    return counts


def read_health(db: Database) -> ReadHealth:
    """The latest answered read of any user, and the users whose last read failed after it."""
    c = USERS.c
    with db.read() as conn:
        last = conn.execute(
            select(func.max(c.last_polled_at)).where(c.last_outcome.in_(sorted(ANSWERED_KINDS)))
        ).scalar_one()
        if last is not None and last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        failing = select(func.count()).where(
            c.token_ciphertext.is_not(None),
            c.consecutive_failures > 0,
            c.last_outcome.in_(sorted(FAILED_KINDS)),
        )
        if last is not None:
            failing = failing.where(c.last_polled_at > last)
        return ReadHealth(last_answered_at=last, failing=conn.execute(failing).scalar_one())


def _due(due_before: datetime) -> ColumnElement[bool]:
    # A `dropping` user keeps its token only to finish the drop: no pass reads with it.
    # 'dropping' is written into the SQL, not bound: SQLite uses the partial index
    # ix_users_due only when the query's condition visibly implies the index's (0006).
    c = USERS.c
    return and_(
        c.token_ciphertext.is_not(None),
        c.state != literal_column("'dropping'"),
        c.next_due_at.is_not(None),
        c.next_due_at <= due_before,
    )


def due_order() -> tuple[ColumnElement[Any], ...]:
    """The order users are claimed in: oldest `next_due_at` first, then id."""
    return (USERS.c.next_due_at, USERS.c.id)


def count_due(db: Database, now: datetime) -> int:
    """Users to read (a token, not dropping) with `next_due_at` at or before `now`."""
    with db.read() as conn:
        return conn.execute(select(func.count()).where(_due(now))).scalar_one()


def claim_due(
    db: Database,
    *,
    now: datetime,
    due_before: datetime,
    limit: int,
    owner: str,
    lease_until: datetime,
    expired: Counter[str] | None = None,
) -> list[UserRow]:
    """Lease up to `limit` due users to `owner`, in `due_order`.

    A user is claimable when it holds a token, is not `dropping`, `next_due_at <=
    due_before`, and no live lease covers it (none, or one that expired before `now`).
    On PostgreSQL the candidate rows are locked with `FOR UPDATE SKIP LOCKED`, so
    concurrent instances claim disjoint sets; on SQLite the write transaction (BEGIN
    IMMEDIATE) serializes claims (`storage._leases`). When `expired` is given, it counts
    the users taken over from another owner's expired lease, per owner. Each claimed
    user gets a new generation (its lease's): a decision made under an earlier claim can
    no longer be written.
    """
    rows, previous = leases.lease_due(
        db,
        _due(due_before),
        due_order(),
        now=now,
        limit=limit,
        owner=owner,
        lease_until=lease_until,
    )
    if expired is not None:
        expired.update(p for p in previous if p not in (None, owner))
    return rows


def _stamp(value: datetime) -> ColumnElement[datetime]:
    return literal(value, UtcDateTime())


def apply(
    db: Database,
    updates: Sequence[UserUpdate],
    owner: str | None = None,
    now: datetime | None = None,
    discarded: list[tuple[UserUpdate, str]] | None = None,
    *,
    results: ResultEvents = "hash",
) -> int:
    """Write the outcome of users' turns in one transaction; return how many were applied.

    Per update: the user's columns; the token deleted (ciphertext and key id NULL) when
    `delete_token` is set or the new state is revoked/dropped, with `revoked_at`/`dropped_at`
    stamped once; the snapshots (history appended when the content changed).

    Fencing: an update carrying a `generation` is written only while the user still has it
    (its lease's while leased), and with `owner` only while `owner` holds the lease, both
    checked under the write lock (`storage._apply`); the snapshots are written only then.
    So a decision about a user re-enrolled, dropped or forgotten since the claim, or taken
    over by another claim, is discarded (`changed`). With `owner` the lease is released.

    The batch is written with a few `executemany` statements under one SAVEPOINT (see
    `storage._apply`). When that fails, it is rolled back and written again one user at a
    time, each under its own SAVEPOINT: a write that fails for one user (a payload that is
    not JSON, say) is rolled back alone and discarded (`failed`); the user stays due, and
    the others of the batch are written. When `discarded` is given, it
    receives (update, reason) for every update not applied. Replaying the same updates
    writes nothing new. Each content stored that differs from the stored one queues a
    `result.changed` event (`results`: with its hashes, with the content too, or "off").
    """
    applied = 0
    # Reported only once the transaction committed: a caller that makes the call again
    # after a failure (a storage error) hears of each update once.
    not_applied: list[tuple[UserUpdate, str]] = []
    with db.write() as conn, outbox.watch_turns(conn, updates, now, results) as turns:
        written, changes = turns.written, turns.changes
        for run in without_repeats(updates):
            mark = len(changes or ())
            try:
                with conn.begin_nested():
                    hits: set[int] | None = write_batch(
                        conn, db.dialect, run, owner, now, changes=changes
                    )
            except (OperationalError, InterfaceError):
                raise  # the database itself is in trouble: not one user's problem
            except Exception:
                hits = None  # one user's write failed: find it, one user at a time
                _forget_after(changes, mark)  # rolled back: no event for them
            for upd in run:
                if hits is None:
                    mark = len(changes or ())
                    try:
                        with conn.begin_nested():
                            hit = bool(
                                write_batch(conn, db.dialect, [upd], owner, now, changes=changes)
                            )
                    except (OperationalError, InterfaceError):
                        raise
                    except Exception:
                        _forget_after(changes, mark)
                        not_applied.append((upd, "failed"))
                        continue
                else:
                    hit = upd.user_id in hits
                if hit:
                    applied += 1
                    written.append(upd)  # its state change is queued for the webhook
                else:
                    not_applied.append((upd, "changed"))
    if discarded is not None:
        discarded += not_applied
    return applied


def _forget_after(changes: list[Any] | None, mark: int) -> None:
    """Drop the changes reported by a write that was then rolled back."""
    if changes is not None:
        del changes[mark:]


def _insert_new(db: Database, values: dict[str, Any]) -> Executable:
    """INSERT the user unless its user id exists, RETURNING the new row id."""
    if db.dialect == "postgresql":
        from sqlalchemy.dialects import postgresql  # imported here: slow to import

        pg = postgresql.insert(User).values(values).on_conflict_do_nothing(index_elements=["user"])
        return pg.returning(User.id)
    from sqlalchemy.dialects import sqlite

    lite = sqlite.insert(User).values(values).on_conflict_do_nothing(index_elements=["user"])
    return lite.returning(User.id)


def store_token(
    db: Database,
    user: str,
    token: EncryptedToken,
    *,
    scopes: Sequence[str],
    now: datetime,
    next_due_at: datetime,
) -> bool:
    """Insert the user or give it a new token, in one transaction; True when it rotated one.

    The user becomes active with the granted scopes, no failures, no denied endpoint, no
    lease, and is due at `next_due_at`; its generation is bumped, so a pass still holding
    the old token (and, say, about to delete it as revoked) writes nothing.
    """
    values: dict[str, Any] = {
        "state": "active",
        "token_ciphertext": token.ciphertext,
        "token_key_id": token.key_id,
        "scopes": list(dict.fromkeys(scopes)),
        "denied": {},
        "enrolled_at": now,
        "next_due_at": next_due_at,
        "consecutive_failures": 0,
        "last_outcome": None,
        "last_code": None,
        "revoked_at": None,
        "dropped_at": None,
        "due_class": None,
    }
    with db.write() as conn:
        inserted = conn.execute(_insert_new(db, {"user": user, **values})).first()
        if inserted is not None:
            outbox.record(conn, [enrollment_event(user, None, False, now)])
            return False
        query = select(User.id, User.state, User.token_ciphertext).where(User.user == user)
        if db.dialect == "postgresql":
            query = query.with_for_update()
        current = conn.execute(query).one()
        leases.end_leases(conn, leases.lease_of(current.id))
        conn.execute(
            update(User)
            .where(User.id == current.id)
            .values({**values, "generation": User.generation + 1})
        )
        had_token = current.token_ciphertext is not None
        outbox.record(conn, [enrollment_event(user, current.state, had_token, now)])
    return current.token_ciphertext is not None


def delete_token(db: Database, user: str, state: UserState, now: datetime) -> bool:
    """Delete the user's token and set `state` (revoked or dropped) in one transaction.

    Returns True when a token was there. Raises UnknownUserError for an unknown user. The
    generation is bumped: a running pass's decision about the user is discarded.
    """
    if state not in TOKENLESS_STATES:
        raise ValueError("delete_token sets state 'revoked' or 'dropped'")
    stamp_column = User.revoked_at if state == "revoked" else User.dropped_at
    with db.write() as conn:
        query = select(User.id, User.state, User.token_ciphertext).where(User.user == user)
        if db.dialect == "postgresql":
            query = query.with_for_update()
        current = conn.execute(query).first()
        if current is None:
            raise UnknownUserError(user)
        leases.end_leases(conn, leases.lease_of(current.id))
        conn.execute(
            update(User)
            .where(User.id == current.id)
            .values(
                {
                    "state": state,
                    "token_ciphertext": None,
                    "token_key_id": None,
                    "next_due_at": None,
                    "due_class": None,
                    "generation": User.generation + 1,
                    stamp_column.key: func.coalesce(stamp_column, _stamp(now))
                    if current.token_ciphertext is None
                    else _stamp(now),
                }
            )
        )
        outbox.record(conn, [change_event(user, current.state, state, now, state)])
    return current.token_ciphertext is not None
