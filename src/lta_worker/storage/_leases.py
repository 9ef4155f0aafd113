"""Leases on users (rows of `user_leases`): claim a batch, renew, release; the claimed rows
as records, cheaply (`raw_user_row`: SQLAlchemy's own processing of the JSON and datetime
columns cost twenty times the SQL).

A claim inserts small lease rows instead of rewriting the claimed users' pages. The lease's
`generation` is the claim's fencing token (one more than the user's); it goes back into
`users.generation` when the lease ends (`end_leases`). PostgreSQL lock order, everywhere:
`users` rows first, then their leases; the lease upsert decides who wins (`claim_statement`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final
from typing import cast as type_cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    String,
    Text,
    bindparam,
    case,
    cast,
    delete,
    func,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.types import NullType

from lta_worker.domain import ChangeEstimate, EncryptedToken, UserRow
from lta_worker.storage._db import Database, Queries
from lta_worker.storage._models import User, UserLease, UtcDateTime

USERS: Final = User.__table__
LEASES: Final = UserLease.__table__

_RAW: Final = frozenset(
    {"scopes", "denied", "enrolled_at", "last_polled_at", "next_due_at", "estimate"}
)
_NAMES: Final = (
    "id",
    "user",
    "state",
    "token_ciphertext",
    "token_key_id",
    "scopes",
    "denied",
    "enrolled_at",
    "last_polled_at",
    "next_due_at",
    "consecutive_failures",
    "last_outcome",
    "last_code",
    "generation",
    "estimate",
)
_JSON: Final = frozenset({"scopes", "denied", "estimate"})


def _raw(name: str, json_as_text: bool) -> ColumnElement[Any]:
    column = USERS.c[name]
    if name not in _RAW:
        return column
    if json_as_text and name in _JSON:
        return type_coerce(cast(column, Text), NullType()).label(name)
    return type_coerce(column, NullType()).label(name)


RAW_USER_COLUMNS: Final[tuple[ColumnElement[Any], ...]] = tuple(
    _raw(name, json_as_text=False) for name in _NAMES
)
# PostgreSQL's JSON as text: the driver's own parsing was half a claim's client CPU.
PG_RAW_USER_COLUMNS: Final[tuple[ColumnElement[Any], ...]] = tuple(
    _raw(name, json_as_text=True) for name in _NAMES
)
_WIDTH: Final = len(RAW_USER_COLUMNS)
_FROM_ISO: Final = datetime.fromisoformat


def _stamp(value: Any) -> datetime | None:
    if value is None:
        return None
    if type(value) is str:
        if value[-6] not in "+-" and value[-1] != "Z":  # naive UTC, as `UtcDateTime` writes
            return _FROM_ISO(value + "+00:00")  # 3x faster than .replace()
        value = _FROM_ISO(value)
    if value.tzinfo is None:
        return type_cast(datetime, value.replace(tzinfo=UTC))
    return type_cast(datetime, value.astimezone(UTC))


@lru_cache(maxsize=64)
def _scopes(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))


def _denied(raw: Any) -> dict[str, datetime]:
    if isinstance(raw, str):
        raw = json.loads(raw)
    return {endpoint: type_cast(datetime, _stamp(str(value))) for endpoint, value in raw.items()}


def _estimate(raw: Any) -> ChangeEstimate | None:
    return ChangeEstimate.from_json(json.loads(raw) if isinstance(raw, str) else raw)


def raw_user_row(row: Any, generation: int | None = None) -> UserRow:
    """A row starting with `RAW_USER_COLUMNS` as a UserRow (`generation`: a new lease's)."""
    (
        id_,
        user,
        state,
        ciphertext,
        key_id,
        scopes,
        denied,
        enrolled_at,
        last_polled_at,
        next_due_at,
        failures,
        last_outcome,
        last_code,
        stored_generation,
        estimate,
    ) = row[:_WIDTH]
    return UserRow(
        id_,
        user,
        state,
        None if ciphertext is None else EncryptedToken(bytes(ciphertext), key_id),
        _scopes(scopes) if type(scopes) is str else tuple(scopes or ()),
        {} if not denied or denied == "{}" else _denied(denied),
        _stamp(enrolled_at),
        _stamp(last_polled_at),
        _stamp(next_due_at),
        failures,
        last_outcome,
        last_code,
        stored_generation if generation is None else generation,
        None if estimate is None else _estimate(estimate),
    )


# Owners of `users drop` / `users forget` leases: no instance's end (nor SQLite's lock) ends them.
DROP_OWNER_PREFIX: Final = "drop:"
DUE_ORDER: Final = (USERS.c.next_due_at, USERS.c.id)


# Positions in a candidate's row (by index: cheaper than by name, a thousand times per claim).
_GEN: Final = [column.name for column in RAW_USER_COLUMNS].index("generation")
_LEASE_OWNER: Final = len(RAW_USER_COLUMNS)
_LEASE_GEN: Final = _LEASE_OWNER + 1
_WON_GEN: Final = _LEASE_GEN + 1


def current_generation() -> ColumnElement[int]:
    """The user's generation: its lease's while it is leased, else its row's."""
    lease = select(LEASES.c.generation).where(LEASES.c.user_id == USERS.c.id)
    return func.coalesce(lease.scalar_subquery(), USERS.c.generation)


def lease_due(
    db: Database,
    condition: ColumnElement[bool],
    *,
    now: datetime,
    limit: int,
    owner: str,
    lease_until: datetime,
) -> tuple[list[UserRow], list[str | None]]:
    """Lease up to `limit` users matching `condition` and no live lease, in `DUE_ORDER`;
    return the leased rows (with the lease's generation) and each one's previous owner."""
    if limit <= 0:
        return [], []
    u, le = USERS.c, LEASES.c
    columns = PG_RAW_USER_COLUMNS if db.dialect == "postgresql" else RAW_USER_COLUMNS
    candidates = (
        select(*columns, le.owner.label("lease_owner"), le.generation.label("lease_gen"))
        .select_from(USERS.outerjoin(LEASES, le.user_id == u.id))
        .where(condition, or_(le.expires_at.is_(None), le.expires_at < now))
        .order_by(*DUE_ORDER)
        .limit(limit)
    )
    params: dict[str, Any] = {"b_owner": owner, "b_until": lease_until, "b_now": now}
    if db.dialect == "postgresql":  # one statement (`claim_statement`)
        with db.write() as conn:
            won = conn.execute(claim_statement(candidates, DUE_ORDER), params).all()
        return [raw_user_row(row, row[_WON_GEN]) for row in won], [row[_LEASE_OWNER] for row in won]
    with db.write() as conn:
        found = conn.execute(candidates).all()
        if not found:
            return [], []
        claimed = {row[0]: max(row[_GEN], row[_LEASE_GEN] or 0) + 1 for row in found}
        params["b_ids"] = _ids_param(claimed)
        conn.execute(_upsert(), params)
    # The write lock held since the candidates were read: all won as computed.
    rows = [raw_user_row(row, claimed[row[0]]) for row in found]
    return rows, [row[_LEASE_OWNER] for row in found]


def claim_statement(candidates: Select[Any], order: Sequence[ColumnElement[Any]]) -> Any:
    """PostgreSQL's claim in one round trip: lock `candidates` (`FOR UPDATE SKIP LOCKED`),
    upsert their leases (never a live one), return the won rows in `order`."""
    from sqlalchemy.dialects.postgresql import insert

    locked = candidates.with_for_update(of=USERS, skip_locked=True).cte("candidates")
    c, mine = locked.c, LEASES.c
    claimed = select(c.id, _OWNER, _UNTIL, c.generation + 1)
    won = _upsert_from(insert(LEASES), claimed).returning(mine.user_id, mine.generation)
    won = won.cte("won")
    return (
        select(locked, won.c.generation)
        .join_from(locked, won, won.c.user_id == c.id)
        .order_by(*(c[column.name] for column in order))
    )


_OWNER: Final = bindparam("b_owner", type_=String())
_UNTIL: Final = bindparam("b_until", type_=UtcDateTime())
_UPSERTS: list[Any] = []


def _upsert() -> Any:
    """SQLite's lease upsert; no RETURNING (it doubles the cost; the write lock wins all)."""
    if not _UPSERTS:
        from sqlalchemy.dialects.sqlite import insert

        each = func.json_each(bindparam("b_ids", type_=String())).table_valued("key", "value")
        # SQLite's parser needs a WHERE in an upsert's SELECT (it would read ON as a join's).
        claimed = select(cast(each.c.key, Integer), _OWNER, _UNTIL, each.c.value).where(
            each.c.value.is_not(None)
        )
        _UPSERTS.append(_upsert_from(insert(LEASES), claimed))
    return _UPSERTS[0]


def _ids_param(claimed: dict[int, int]) -> str:
    """SQLite: `{id: new generation}` as one JSON parameter (cheaper than a thousand parameters)."""
    return json.dumps(dict(sorted(claimed.items())))


def _upsert_from(insert: Any, claimed: Select[Any]) -> Any:
    """Insert the leases `claimed` selects, or take over expired ones (never a live one);
    a taken-over lease's generation is at least one more than its own."""
    mine = LEASES.c
    stmt = insert.from_select(["user_id", "owner", "expires_at", "generation"], claimed)
    taken_over = {
        "owner": stmt.excluded.owner,
        "expires_at": stmt.excluded.expires_at,
        "generation": case(
            (mine.generation >= stmt.excluded.generation, mine.generation + 1),
            else_=stmt.excluded.generation,
        ),
    }
    return stmt.on_conflict_do_update(
        index_elements=[mine.user_id],
        set_=taken_over,
        where=mine.expires_at < bindparam("b_now", type_=UtcDateTime()),
    )


def end_leases(conn: Connection, condition: ColumnElement[bool]) -> int:
    """End the leases matching `condition`, their generation kept in `users`; how many."""
    le = LEASES.c
    held = select(le.user_id).where(condition)
    generation = select(le.generation).where(le.user_id == USERS.c.id).scalar_subquery()
    ended = (
        conn.execute(
            update(USERS)
            .where(USERS.c.id.in_(held))
            .values(generation=generation)
            .returning(USERS.c.id)
        )
        .scalars()
        .all()
    )
    if not ended:
        return 0
    conn.execute(delete(LEASES).where(condition, le.user_id.in_(ended)))
    return len(ended)


def owned_by(owner: str, user_ids: Sequence[int] | None = None) -> ColumnElement[bool]:
    """The leases `owner` holds (only on `user_ids` when given)."""
    if user_ids is None:
        return LEASES.c.owner == owner
    return (LEASES.c.owner == owner) & LEASES.c.user_id.in_(user_ids)


def lease_of(user_id: int) -> ColumnElement[bool]:
    """The lease on one user."""
    return LEASES.c.user_id == user_id


class LeaseQueries(Queries):
    """The leases an owner holds: renew them, end them."""

    def renew_leases(
        self, owner: str, lease_until: datetime, held: set[tuple[int, int]] | None = None
    ) -> int:
        """Extend every lease `owner` holds to `lease_until`, never shortening one (a renewal
        delayed by a stalled database must not cut a later claim's); how many. `held` gets the
        leases still held (one missing was ended by another: issue 28). Locked ones are skipped.
        """
        owned = select(LEASES.c.user_id).where(LEASES.c.owner == owner)
        owned = owned.with_for_update(skip_locked=True)
        until = bindparam("b_until", lease_until, type_=UtcDateTime())
        with self._db.write() as conn:
            result = conn.execute(
                update(LEASES)
                .where(LEASES.c.user_id.in_(owned), LEASES.c.expires_at < until)
                .values(expires_at=until)
            )
            if held is not None:
                mine = select(LEASES.c.user_id, LEASES.c.generation).where(LEASES.c.owner == owner)
                held.update((row.user_id, row.generation) for row in conn.execute(mine))
        return result.rowcount

    def release(self, owner: str, user_ids: Iterable[int] | None = None) -> int:
        """End the leases `owner` holds (only on `user_ids` when given); return how many."""
        ids = None if user_ids is None else list(user_ids)
        if ids is not None and not ids:
            return 0
        with self._db.write() as conn:
            return end_leases(conn, owned_by(owner, ids))

    def release_all(self) -> dict[str, int]:
        """End every instance's lease (SQLite at start, under the single-instance lock); how
        many users each owner held. Drop commands' leases are left: their DELETE may be out."""
        of_instances = LEASES.c.owner.not_like(DROP_OWNER_PREFIX + "%")
        with self._db.write() as conn:
            held = conn.execute(
                select(LEASES.c.owner, func.count()).where(of_instances).group_by(LEASES.c.owner)
            ).all()
            if held:
                end_leases(conn, of_instances)
        return {str(owner): int(count) for owner, count in held}
