"""Queries on users: read, claim due users under a lease, apply turns, store and delete tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
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
from lta_worker.storage._apply import USERS, ResultChange, without_repeats, write_batch
from lta_worker.storage._db import Dialect, Queries, insert_for
from lta_worker.storage._leases import RAW_USER_COLUMNS, raw_user_row
from lta_worker.storage._models import User, UtcDateTime

USER_COLUMNS: Final = (*RAW_USER_COLUMNS, leases.current_generation().label("current"))


def to_user_row(row: Row[Any]) -> UserRow:
    """Turn a row of `USER_COLUMNS` (its current generation last) into a UserRow."""
    return raw_user_row(row, row[-1])


def _due(due_before: datetime) -> ColumnElement[bool]:
    # 'dropping' is written into the SQL, not bound: SQLite uses the partial index
    # ix_users_due only when the query's condition visibly implies the index's.
    c = USERS.c
    return and_(
        c.token_ciphertext.is_not(None),
        c.state != literal_column("'dropping'"),
        c.next_due_at.is_not(None),
        c.next_due_at <= due_before,
    )


def _locked(user: str) -> Select[int, str, bytes | None]:
    """The user's id, state and token, its row locked (PostgreSQL; SQLite's write holds all)."""
    return (
        select(User.id, User.state, User.token_ciphertext)
        .where(User.user == user)
        .with_for_update()
    )


def _attempt(
    conn: Connection,
    dialect: Dialect,
    run: Sequence[UserUpdate],
    owner: str | None,
    now: datetime | None,
    *,
    changes: list[ResultChange] | None,
) -> set[int] | None:
    """`write_batch` under a SAVEPOINT: the users written, or None when it was rolled back."""
    mark = len(changes or ())
    try:
        with conn.begin_nested():
            return write_batch(conn, dialect, run, owner, now, changes=changes)
    except (OperationalError, InterfaceError):
        raise  # the database itself is in trouble: not one user's problem
    except Exception:
        if changes is not None:
            del changes[mark:]  # rolled back: no event for them
        return None


class UserQueries(Queries):
    """The users: read them, claim the due ones, write their turns, store and delete tokens."""

    result_events: ResultEvents = "hash"
    """What `apply` queues for a changed content (`WebhookSettings.result_events`)."""
    on_lease_expired: Callable[[str, int], None] | None = None
    """Called with (owner, users) when `claim_due` takes over another owner's expired leases."""

    def get_user(self, user: str) -> UserRow | None:
        """The user with the client's user id `user`, or None."""
        with self._db.read() as conn:
            row = conn.execute(select(*USER_COLUMNS).where(User.user == user)).first()
        return to_user_row(row) if row is not None else None

    def list_users(self, batch: int = 500) -> Iterator[UserRow]:
        """Every user in id order, read in keyset batches (one short transaction per batch)."""
        for row in self._db.pages(select(*USER_COLUMNS), (User.id,), (0,), batch):
            yield to_user_row(row)

    def count_by_state(self) -> dict[str, int]:
        """Users per state; every state is present (0 when none)."""
        counts: dict[str, int] = dict.fromkeys(USER_STATES, 0)
        with self._db.read() as conn:
            for state, count in conn.execute(select(User.state, func.count()).group_by(User.state)):
                counts[state] = count
        return counts

    def read_health(self) -> ReadHealth:
        """The latest answered read of any user, and the users whose last read failed after it."""
        c = USERS.c
        with self._db.read() as conn:
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

    def count_due(self, now: datetime) -> int:
        """Users to read (a token, not dropping) with `next_due_at` at or before `now`."""
        with self._db.read() as conn:
            return conn.execute(select(func.count()).where(_due(now))).scalar_one()

    def claim_due(
        self,
        *,
        now: datetime,
        due_before: datetime,
        limit: int,
        owner: str,
        lease_until: datetime,
    ) -> list[UserRow]:
        """Lease up to `limit` users due by `due_before` to `owner`, oldest due first, each
        with a new generation (`storage._leases`): an earlier claim's decision is not written.
        """
        rows, previous = leases.lease_due(
            self._db,
            _due(due_before),
            now=now,
            limit=limit,
            owner=owner,
            lease_until=lease_until,
        )
        if self.on_lease_expired is not None:
            expired = Counter(p for p in previous if p is not None and p != owner)
            for previous_owner, count in sorted(expired.items()):
                self.on_lease_expired(previous_owner, count)
        return rows

    def apply(
        self,
        updates: Sequence[UserUpdate],
        owner: str | None = None,
        *,
        now: datetime | None = None,
        discarded: list[tuple[UserUpdate, str]] | None = None,
    ) -> int:
        """Write users' turns in one transaction, fenced (`storage._apply`); how many were.

        Not written, into `discarded`: `changed` (the generation or `owner`'s lease moved on),
        or `failed` (the user whose write failed when the batch is retried one by one).
        """
        applied = 0
        # Reported only once committed: a caller retrying after a storage error hears once.
        not_applied: list[tuple[UserUpdate, str]] = []
        db = self._db
        with (
            db.write() as conn,
            outbox.watch_turns(conn, updates, now, self.result_events) as turns,
        ):
            written, changes = turns.written, turns.changes
            for run in without_repeats(updates):
                hits = _attempt(conn, db.dialect, run, owner, now, changes=changes)
                for upd in run:
                    if hits is None:  # one user's write failed: find it, one user at a time
                        one = _attempt(conn, db.dialect, [upd], owner, now, changes=changes)
                        if one is None:
                            not_applied.append((upd, "failed"))
                            continue
                        hit = bool(one)
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

    def store_token(
        self,
        user: str,
        token: EncryptedToken,
        scopes: Sequence[str],
        now: datetime,
        next_due_at: datetime,
    ) -> bool:
        """Insert the user or give it a new token and generation; True when it rotated one."""
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
        new = insert_for(self._db.dialect, User).values(user=user, **values)
        new = new.on_conflict_do_nothing(index_elements=["user"]).returning(User.id)
        with self._db.write() as conn:
            inserted = conn.execute(new).first()
            if inserted is not None:
                outbox.record(conn, [enrollment_event(user, None, False, now)])
                return False
            current = conn.execute(_locked(user)).one()
            leases.end_leases(conn, leases.lease_of(current.id))
            conn.execute(
                update(User)
                .where(User.id == current.id)
                .values({**values, "generation": User.generation + 1})
            )
            had_token = current.token_ciphertext is not None
            outbox.record(conn, [enrollment_event(user, current.state, had_token, now)])
        return current.token_ciphertext is not None

    def delete_token(self, user: str, state: UserState, now: datetime) -> bool:
        """Delete the user's token, set `state` (revoked or dropped) and a new generation;
        True when a token was there."""
        if state not in TOKENLESS_STATES:
            raise ValueError("delete_token sets state 'revoked' or 'dropped'")
        stamp_column = User.revoked_at if state == "revoked" else User.dropped_at
        stamp = literal(now, UtcDateTime())
        with self._db.write() as conn:
            current = conn.execute(_locked(user)).first()
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
                        stamp_column.key: func.coalesce(stamp_column, stamp)
                        if current.token_ciphertext is None
                        else stamp,
                    }
                )
            )
            outbox.record(conn, [change_event(user, current.state, state, now, state)])
        return current.token_ciphertext is not None
