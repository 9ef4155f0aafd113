"""Leases in their own table (`user_leases`), on SQLite and PostgreSQL: a claim leaves the
users' rows alone, fencing still holds across take-overs and releases, the lease upsert never
takes a live lease, and a 0.1.0 database keeps its leases through the migration."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import event, inspect, null, select, text

from lta_worker.domain import UserRow
from lta_worker.storage import Store, Vault
from lta_worker.storage import _leases as leases
from lta_worker.storage._leases import RAW_USER_COLUMNS
from lta_worker.storage._migrate import alembic_config
from support.storage import MINUTE, T0, enroll, keyring

from .test_fencing import turn

LEASE = 5 * MINUTE


@pytest.fixture
def vault() -> Vault:
    """A one-key vault."""
    return Vault(keyring("k1"))


def _claim(store: Store, owner: str, at: timedelta = timedelta(0)) -> list[UserRow]:
    now = T0 + at
    return store.claim_due(now=now, due_before=now, limit=9, owner=owner, lease_until=now + LEASE)


def _at(store: Store, when: datetime | None) -> datetime | None:
    """A timestamp as a raw statement takes it: naive UTC for SQLite."""
    if when is None or store.database.dialect == "postgresql":
        return when
    return when.replace(tzinfo=None)


def test_a_claim_leaves_the_users_rows_as_they_were(store: Store, vault: Vault) -> None:
    """Claiming writes only leases: every column of every user's row is unchanged."""
    for name in ("a", "b", "c"):
        enroll(store, vault, name, due=T0 - MINUTE)
    with store.database.read() as conn:
        before = conn.execute(text("SELECT * FROM users ORDER BY id")).all()
    assert len(_claim(store, "i1")) == 3
    with store.database.read() as conn:
        assert conn.execute(text("SELECT * FROM users ORDER BY id")).all() == before
        held = conn.execute(text("SELECT owner, count(*) FROM user_leases GROUP BY owner")).all()
    assert [tuple(row) for row in held] == [("i1", 3)]


def test_a_stale_decision_stays_stale_after_take_over_release_and_reclaim(
    store: Store, vault: Vault
) -> None:
    """i1's lease expires, i2 takes over and releases, i1 claims again: only the last counts."""
    enroll(store, vault, "a", due=T0 - MINUTE)
    (first,) = _claim(store, "i1")
    (taken,) = _claim(store, "i2", at=2 * LEASE)
    assert store.release("i2") == 1
    (again,) = _claim(store, "i1", at=2 * LEASE)
    assert first.generation < taken.generation < again.generation
    assert store.get_user("a") == again  # a leased user's generation is its lease's
    assert store.apply([turn(first, snapshots=())], owner="i1") == 0
    assert store.apply([turn(again, snapshots=())], owner="i1") == 1
    after = store.get_user("a")
    assert after is not None and after.generation == again.generation  # kept in the row


def test_the_lease_upsert_never_takes_a_live_lease(store: Store, vault: Vault) -> None:
    """A racing claim's upsert leaves a live lease alone; an expired one is taken over."""
    live = enroll(store, vault, "live", due=T0 - MINUTE)
    gone = enroll(store, vault, "gone", due=T0 - MINUTE)
    assert len(_claim(store, "first")) == 2
    with store.database.write() as conn:
        conn.execute(
            text("UPDATE user_leases SET expires_at = :t WHERE user_id = :id"),
            {"t": _at(store, T0 - MINUTE), "id": gone.id},
        )
        params = {"b_owner": "second", "b_until": T0 + LEASE, "b_now": T0}
        if store.database.dialect == "postgresql":
            # Candidates read before the first claim committed: both users, no lease seen.
            both = select(*RAW_USER_COLUMNS, null(), null()).where(
                leases.USERS.c.id.in_([live.id, gone.id])
            )
            won = conn.execute(leases.claim_statement(both, [leases.USERS.c.id]), params)
            assert [row[0] for row in won] == [gone.id]
        else:
            claimed = {user.id: user.generation + 1 for user in (live, gone)}
            conn.execute(leases._upsert(), {"b_ids": leases._ids_param(claimed), **params})
        held = conn.execute(text("SELECT user_id, owner FROM user_leases ORDER BY user_id"))
        assert sorted(tuple(row) for row in held) == [(live.id, "first"), (gone.id, "second")]


def test_a_claim_on_postgresql_is_one_statement(store: Store, vault: Vault) -> None:
    """On PostgreSQL the locks, the leases' upsert and the rows come in one statement."""
    if store.database.dialect != "postgresql":
        pytest.skip("SQLite's claim is two statements under its write lock")
    for name in ("a", "b"):
        enroll(store, vault, name, due=T0 - MINUTE)
    sent: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    event.listen(store.database.engine, "before_cursor_execute", count)
    try:
        claimed = _claim(store, "i1")
    finally:
        event.remove(store.database.engine, "before_cursor_execute", count)
    assert [user.user for user in claimed] == ["a", "b"]
    assert len(sent) == 1


def test_a_claim_leaves_its_connection_synced_and_checked(tmp_path: Path, vault: Vault) -> None:
    """The claim commits as every write does: synchronous=FULL, foreign keys checked."""
    with Store.open(f"sqlite:///{tmp_path / 'lta.db'}") as store:
        store.upgrade()
        enroll(store, vault, "a", due=T0 - MINUTE)
        assert len(_claim(store, "i1")) == 1
        with store.database.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1


def test_upgrade_from_0_1_0_keeps_live_leases_and_results(empty_url: str, vault: Vault) -> None:
    """A 0.1.0 database's lease in its row moves to user_leases (generation 0, no foreign
    key), the lease columns go, results stay, and the owner's fenced decision is written."""
    if empty_url.startswith("sqlite"):
        Path(empty_url.removeprefix("sqlite:///")).parent.mkdir(mode=0o700)
    with Store.open(empty_url) as store:
        command.upgrade(alembic_config(store.database), "0002")
        with store.database.write() as conn:
            for name, owner in (("leased", "i1"), ("free", None)):
                conn.execute(
                    text(
                        'INSERT INTO users ("user", state, token_ciphertext, token_key_id, scopes,'
                        " denied, next_due_at, consecutive_failures, lease_owner,"
                        " lease_expires_at) VALUES (:user, 'active', :ct, 'k1', '[]', '{}',"
                        " :due, 0, :owner, :until)"
                    ),
                    {
                        "user": name,
                        "ct": b"x",
                        "due": _at(store, T0),
                        "owner": owner,
                        "until": _at(store, T0 + LEASE) if owner else None,
                    },
                )
            conn.execute(
                text(
                    "INSERT INTO snapshots (user_id, endpoint, status, payload, content_hash,"
                    " fetched_at, changed_at) SELECT id, 'stats', 'none', NULL, 'h', :at, :at"
                    " FROM users WHERE \"user\" = 'leased'"
                ),
                {"at": _at(store, T0)},
            )
        store.upgrade()
        with store.database.read() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("users")}
            moved = conn.execute(text("SELECT owner, generation FROM user_leases")).all()
            keys = inspect(conn).get_foreign_keys("user_leases")
            kept = conn.execute(text("SELECT count(*) FROM snapshots")).scalar_one()
        assert not columns & {"lease_owner", "lease_expires_at"}
        assert [tuple(row) for row in moved] == [("i1", 0)]
        assert (keys, kept) == ([], 1)
        leased = store.get_user("leased")
        assert leased is not None and leased.generation == 0
        assert _claim(store, "i2") == [store.get_user("free")]  # the live lease is kept
        assert store.apply([turn(leased, snapshots=())], owner="i1") == 1


def test_a_late_renewal_never_shortens_a_lease_claimed_after_it(store: Store, vault: Vault) -> None:
    """A renewal computed before a stall never shortens a later claim's lease (issue 28)."""
    enroll(store, vault, "a", due=T0 - MINUTE)
    assert [u.user for u in _claim(store, "i1")] == ["a"]  # lease to T0 + LEASE
    late = LEASE + MINUTE  # the lease lapsed; i1 claims the user again, to late + LEASE
    assert [u.user for u in _claim(store, "i1", late)] == ["a"]
    assert store.renew_leases("i1", T0 + 2 * MINUTE + LEASE) == 0  # computed before the stall
    assert _claim(store, "i2", late + LEASE - MINUTE) == []
    assert [u.user for u in _claim(store, "i2", late + LEASE + MINUTE)] == ["a"]
