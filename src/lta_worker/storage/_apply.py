"""Writing a batch of users' turns in a few statements whatever its size (one per user cost
more than the reads): fence the users (`_fence`), one UPDATE per shape, the snapshots.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from sqlalchemy import Connection, bindparam, delete, func, select, tuple_, update
from sqlalchemy.sql.dml import Insert

from lta_worker.domain import TOKENLESS_STATES, UserUpdate
from lta_worker.storage._db import Dialect, insert_for
from lta_worker.storage._feed import write_seq
from lta_worker.storage._models import History, Snapshot, User, UserLease, UtcDateTime
from lta_worker.storage._results import content_hash

USERS: Final = User.__table__
LEASES: Final = UserLease.__table__
SNAPSHOTS: Final = Snapshot.__table__
HISTORY: Final = History.__table__

# None: keep the token; "clear"; or the state whose stamp (revoked_at, dropped_at) to set.
_TokenAction = str | None
# (sets last_polled_at, token, sets the freshness estimate)
_Shape = tuple[bool, _TokenAction, bool]


class ResultChange(NamedTuple):
    """A content stored that differs from the one stored before (None: the first)."""

    update: UserUpdate
    endpoint: str
    status: str
    content_hash: str
    previous_hash: str | None
    fetched_at: datetime
    payload: Any


def without_repeats(updates: Sequence[UserUpdate]) -> Iterator[list[UserUpdate]]:
    """The updates in order, cut into runs in which each user appears once."""
    run: list[UserUpdate] = []
    seen: set[int] = set()
    for upd in updates:
        if upd.user_id in seen:
            yield run
            run, seen = [], set()
        run.append(upd)
        seen.add(upd.user_id)
    if run:
        yield run


def write_batch(
    conn: Connection,
    dialect: Dialect,
    updates: Sequence[UserUpdate],
    owner: str | None,
    now: datetime | None,
    *,
    changes: list[ResultChange] | None = None,
) -> set[int]:
    """Write `updates` (each user at most once), ending `owner`'s leases on them; return the
    ids written. `changes` receives each changed content once every statement succeeded."""
    hits = _fence(conn, updates, owner)
    if not hits:
        return set()
    written = [upd for upd in updates if upd.user_id in hits]
    shapes: dict[_Shape, list[dict[str, Any]]] = {}
    for upd in written:
        shape, params = _user_params(upd, now)
        params["b_generation"] = hits[upd.user_id]
        shapes.setdefault(shape, []).append(params)
    for shape, rows in shapes.items():
        conn.execute(_user_statement(shape), rows)
    if owner is not None:
        conn.execute(
            delete(LEASES).where(LEASES.c.owner == owner, LEASES.c.user_id.in_(list(hits)))
        )
    found = _write_snapshots(conn, dialect, written)
    if changes is not None:
        changes += found
    return set(hits)


def _fence(conn: Connection, updates: Sequence[UserUpdate], owner: str | None) -> dict[int, int]:
    """The users of `updates` still at their generation and leased to `owner`, with their
    current generation."""
    u, le = USERS.c, LEASES.c
    ids = [upd.user_id for upd in updates]
    # PostgreSQL: lock, then read, in two statements. One `FOR UPDATE OF users` joined with
    # the leases would return, after waiting for `begin_drop`'s lock, the lease of the
    # statement's start (the pass's own), and write a decision about a dropped user (issue 28).
    if conn.dialect.name == "postgresql":
        conn.execute(select(u.id).where(u.id.in_(ids)).order_by(u.id).with_for_update())
    query = (
        select(u.id, u.generation, le.owner, le.generation.label("lease_generation"))
        .select_from(USERS.outerjoin(LEASES, le.user_id == u.id))
        .where(u.id.in_(ids))
    )
    current = {row.id: row for row in conn.execute(query)}
    hits: dict[int, int] = {}
    for upd in updates:
        row = current.get(upd.user_id)
        if row is None:
            continue
        generation = row.generation if row.owner is None else row.lease_generation
        if upd.generation is not None and generation != upd.generation:
            continue
        if owner is not None and row.owner != owner:
            continue
        hits[upd.user_id] = generation
    return hits


def _denied_in(denied: Mapping[str, datetime]) -> dict[str, str]:
    out: dict[str, str] = {}
    for endpoint, when in denied.items():
        if when.tzinfo is None:
            raise ValueError("storage takes timezone-aware datetimes only (use UTC)")
        out[endpoint] = when.astimezone(UTC).isoformat()
    return out


def _user_params(upd: UserUpdate, now: datetime | None) -> tuple[_Shape, dict[str, Any]]:
    params: dict[str, Any] = {
        "b_id": upd.user_id,
        "b_state": upd.state,
        "b_next_due_at": upd.next_due_at,
        "b_consecutive_failures": upd.consecutive_failures,
        "b_last_outcome": upd.last_outcome,
        "b_last_code": upd.last_code,
        "b_denied": _denied_in(upd.denied),
        "b_due_class": upd.due_class,
    }
    polled = upd.last_polled_at is not None
    if polled:
        params["b_last_polled_at"] = upd.last_polled_at
    erase: _TokenAction = None
    if upd.delete_token or upd.state in TOKENLESS_STATES:
        erase = upd.state if upd.state in ("revoked", "dropped") else "clear"
        if erase != "clear":
            when = now or upd.last_polled_at
            if when is None:  # storage never reads the clock: the caller says when
                raise ValueError("deleting a token needs `now` or the update's last_polled_at")
            params["b_stamp"] = when
    estimated = upd.estimate is not None
    if upd.estimate is not None:
        params["b_estimate"] = upd.estimate.to_json()
        params["b_plan_bucket"], params["b_rate_bucket"] = upd.estimate.buckets()
    return (polled, erase, estimated), params


_STATEMENTS: dict[_Shape, Any] = {}


def _user_statement(shape: _Shape) -> Any:
    """The UPDATE of `users` for one shape of update (built once per shape)."""
    stmt = _STATEMENTS.get(shape)
    if stmt is not None:
        return stmt
    polled, erase, estimated = shape
    c = USERS.c
    values: dict[str, Any] = {
        "state": bindparam("b_state"),
        "next_due_at": bindparam("b_next_due_at"),
        "consecutive_failures": bindparam("b_consecutive_failures"),
        "last_outcome": bindparam("b_last_outcome"),
        "last_code": bindparam("b_last_code"),
        "denied": bindparam("b_denied"),
        "due_class": bindparam("b_due_class"),
        "generation": bindparam("b_generation"),
    }
    if polled:
        values["last_polled_at"] = bindparam("b_last_polled_at")
    if estimated:
        values["estimate"] = bindparam("b_estimate")
        values["plan_bucket"] = bindparam("b_plan_bucket")
        values["rate_bucket"] = bindparam("b_rate_bucket")
    if erase is not None:
        values["token_ciphertext"] = None
        values["token_key_id"] = None
        if erase != "clear":
            column = c.revoked_at if erase == "revoked" else c.dropped_at
            values[column.key] = func.coalesce(column, bindparam("b_stamp", type_=UtcDateTime()))
    stmt = update(USERS).where(c.id == bindparam("b_id")).values(values)
    _STATEMENTS[shape] = stmt
    return stmt


def _write_snapshots(
    conn: Connection, dialect: Dialect, written: Sequence[UserUpdate]
) -> list[ResultChange]:
    """Upsert the snapshots, append history where the content changed; return those changes."""
    writes = [(upd, snap) for upd in written for snap in upd.snapshots]
    if not writes:
        return []
    s = SNAPSHOTS.c
    query = (
        select(s.user_id, s.endpoint, s.status, s.content_hash, s.fetched_at)
        .where(
            tuple_(s.user_id, s.endpoint).in_(
                sorted({(upd.user_id, snap.endpoint) for upd, snap in writes})
            )
        )
        .with_for_update()
    )
    # (user, endpoint) -> (status, content hash, fetched_at), as it stands after each write.
    state: dict[tuple[int, str], tuple[str, str, datetime]] = {
        (row.user_id, row.endpoint): (row.status, row.content_hash, row.fetched_at)
        for row in conn.execute(query)
    }
    changed: dict[tuple[int, str], dict[str, Any]] = {}
    touched: dict[tuple[int, str], datetime] = {}
    history: list[dict[str, Any]] = []
    found: list[ResultChange] = []
    for upd, snap in writes:
        user_id = upd.user_id
        key = (user_id, snap.endpoint)
        digest = content_hash(snap.payload, snap.content)
        current = state.get(key)
        if current is not None and snap.fetched_at <= current[2]:
            continue  # a replay, or older than what is stored
        state[key] = (snap.status, digest, snap.fetched_at)
        if current is not None and (current[0], current[1]) == (snap.status, digest):
            if key in changed:
                changed[key]["fetched_at"] = snap.fetched_at
            else:
                touched[key] = snap.fetched_at
            continue
        content = {
            "user_id": user_id,
            "endpoint": snap.endpoint,
            "status": snap.status,
            "payload": snap.payload,
            "content_hash": digest,
            "fetched_at": snap.fetched_at,
        }
        touched.pop(key, None)
        changed[key] = {**content, "changed_at": snap.fetched_at}
        history.append(content)
        previous = None if current is None else current[1]
        found.append(
            ResultChange(
                upd, snap.endpoint, snap.status, digest, previous, snap.fetched_at, snap.payload
            )
        )
    if changed:
        conn.execute(_upsert(dialect), list(changed.values()))
    if touched:
        conn.execute(
            update(SNAPSHOTS)
            .where(s.user_id == bindparam("b_user_id"), s.endpoint == bindparam("b_endpoint"))
            .values(fetched_at=bindparam("b_fetched_at")),
            [
                {"b_user_id": uid, "b_endpoint": endpoint, "b_fetched_at": at}
                for (uid, endpoint), at in touched.items()
            ],
        )
    if history:
        conn.execute(HISTORY.insert().values(seq=write_seq(conn, dialect)), history)
    return found


_UPSERTS: dict[Dialect, Insert] = {}


def _upsert(dialect: Dialect) -> Insert:
    """INSERT a snapshot, or replace the content of the one stored for (user, endpoint)."""
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        insert = insert_for(dialect, SNAPSHOTS)
        replaced = ("status", "payload", "content_hash", "fetched_at", "changed_at")
        stmt = _UPSERTS[dialect] = insert.on_conflict_do_update(
            index_elements=["user_id", "endpoint"],
            set_={name: insert.excluded[name] for name in replaced},
        )
    return stmt
