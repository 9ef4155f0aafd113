"""The change feed (`Store.changed_since`): every content stored after a cursor, once, in the
order stored, and a cursor to pass next time that no later write falls behind. Over every
backend (two instances and out-of-order commits on PostgreSQL: tests/multi/test_feed.py)."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lta_worker.domain import ResultRow, UserUpdate
from lta_worker.errors import CursorError
from lta_worker.storage import Store, Vault
from support.pg import PgDatabases
from support.storage import HOUR, MINUTE, T0, enroll, newest_position, position, read_turn


def read(user_id: int, minute: int, **payloads: Any) -> UserUpdate:
    """A turn at T0 + `minute` that read `payloads` (endpoint with `_` for `-`)."""
    return read_turn(user_id, T0 + minute * MINUTE, **payloads)


def take(
    store: Store, cursor: str | int, user: str | None = None
) -> tuple[str, list[tuple[Any, ...]]]:
    """The feed from `cursor` past every row and gone line stored so far (retried while a PG
    transaction lags)."""
    newest = newest_position(store)
    rows: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 30
    while True:
        feed = store.changed_since(cursor, user)
        rows += [
            (r.user, r.endpoint, r.payload) if isinstance(r, ResultRow) else (r.user, r.reason)
            for r in feed.rows
        ]
        assert position(feed.cursor) >= position(cursor)
        cursor = feed.cursor
        if position(cursor) > newest:
            return cursor, rows
        assert time.monotonic() < deadline, "the feed never passed the newest row"
        time.sleep(0.01)


def test_each_change_once_in_the_order_stored(store: Store, vault: Vault) -> None:
    """Each stored content comes once, in order, after the cursor; the cursor never goes back."""
    a = enroll(store, vault, "a").id
    b = enroll(store, vault, "b").id
    store.apply([read(a, 1, latest_change={"v": 1}, stats={"s": 1})])
    store.apply([read(b, 1, latest_change={"v": 1})])
    c1, rows = take(store, 0)
    assert rows == [
        ("a", "latest-change", {"v": 1}),
        ("a", "stats", {"s": 1}),
        ("b", "latest-change", {"v": 1}),
    ]
    assert take(store, c1)[1] == []
    store.apply([read(a, 2, latest_change={"v": 1}, stats={"s": 2})])
    store.apply([read(b, 2, latest_change={"v": 2})])
    store.apply([read(b, 3, latest_change={"v": 3})])
    c2, rows = take(store, c1)
    assert rows == [
        ("a", "stats", {"s": 2}),
        ("b", "latest-change", {"v": 2}),
        ("b", "latest-change", {"v": 3}),
    ]
    assert position(c2) > position(c1)
    assert take(store, c2)[1] == []
    assert len(take(store, 0)[1]) == 6


def test_one_users_changes_and_feed_after_forget(store: Store, vault: Vault) -> None:
    """`user` filters rows, not the cursor; forgetting the newest row's user hides no change."""
    a = enroll(store, vault, "a").id
    b = enroll(store, vault, "b").id
    store.apply([read(a, 1, latest_change={"v": 1})])
    store.apply([read(b, 1, latest_change={"v": 1})])
    cursor, rows = take(store, 0, "b")
    assert rows == [("b", "latest-change", {"v": 1})]
    assert store.begin_drop("b", T0, purge=True).purged == 2
    store.apply([read(a, 2, latest_change={"v": 2})])
    assert take(store, cursor)[1] == [("b", "forget"), ("a", "latest-change", {"v": 2})]
    assert take(store, cursor, "a")[1] == [("a", "latest-change", {"v": 2})]


def test_a_retention_purge_is_a_feed_line(store: Store, vault: Vault) -> None:
    """A retention purge is a feed line naming the user, until the history's retention drops it."""
    a = enroll(store, vault, "a").id
    store.apply([read(a, 1, latest_change={"v": 1})])
    cursor, _ = take(store, 0)
    store.delete_token("a", "revoked", T0 + HOUR)
    assert store.purge_expired(T0 + 2 * HOUR, timedelta(0)).users == 1
    assert take(store, cursor)[1] == [("a", "retention")]
    store.purge_expired(T0 + 400 * 24 * HOUR, timedelta(0), history=timedelta(days=365))
    assert take(store, 0)[1] == []


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        ("-1", "malformed"),
        ("yesterday", "malformed"),
        ("abc.12.3", "malformed"),
        (str(2**63), "legacy"),
        ("1000000000", "legacy"),
        ("0123456789abcdef.5", "other_database"),
        ("0123456789abcdef." + "9" * 20, "malformed"),
    ],
)
def test_a_cursor_never_issued_is_refused(store: Store, cursor: str, reason: str) -> None:
    """A cursor this database never issued is a CursorError naming the way back, never empty."""
    with pytest.raises(CursorError) as raised:
        store.changed_since(cursor)
    assert raised.value.reason == reason
    assert raised.value.hint is not None and "0" in raised.value.hint


def test_a_cursor_ahead_or_of_another_database_is_refused(store: Store, tmp_path: Path) -> None:
    """This history's cursor beyond what it issued is `ahead`; another database's is refused."""
    history = take(store, 0)[0].rpartition(".")[0]
    with Store.open(f"sqlite:///{tmp_path / 'other.db'}") as second:
        second.upgrade()
        other = second.changed_since(0).cursor
    for cursor, reason in ((f"{history}.{2**62}", "ahead"), (other, "other_database")):
        with pytest.raises(CursorError) as raised:
            store.changed_since(cursor)
        assert raised.value.reason == reason


def test_a_restored_sqlite_file_never_skips_what_it_stores_after(
    tmp_path: Path, sqlite_template: Path, vault: Vault
) -> None:
    """A cursor past a restored backup is refused until new rows, then returns every one of them."""
    live, backup = tmp_path / "lta.db", tmp_path / "backup.db"
    shutil.copyfile(sqlite_template, live)
    live.chmod(0o600)
    url = f"sqlite:///{live}"
    with Store.open(url) as store:
        a = enroll(store, vault, "a").id
        store.apply([read(a, 1, latest_change={"v": 1})])
    shutil.copyfile(live, backup)
    with Store.open(url) as store:
        store.apply([read(a, 2, latest_change={"v": 2})])
        store.apply([read(a, 3, latest_change={"v": 3})])
        cursor, rows = take(store, 0)
    assert len(rows) == 3
    shutil.copyfile(backup, live)
    with Store.open(url) as store:
        with pytest.raises(CursorError) as raised:
            store.changed_since(cursor)
        assert raised.value.reason == "ahead"
        store.apply([read(a, 4, latest_change={"v": 4})])
        assert take(store, cursor)[1] == [("a", "latest-change", {"v": 4})]


def test_feed_reads_in_batches(store: Store, vault: Vault) -> None:
    """More rows than a batch come out whole, in order (keyset over (seq, id))."""
    ids = [enroll(store, vault, f"u{i}").id for i in range(7)]
    for minute in (1, 2):
        store.apply([read(uid, minute, latest_change={"v": minute}) for uid in ids])
    take(store, 0)  # every write ended
    rows = list(store.changed_since(0, batch=3).rows)
    assert [(r.user, r.payload["v"]) for r in rows] == [
        (f"u{i}", minute) for minute in (1, 2) for i in range(7)
    ]


@pytest.mark.postgres
def test_a_pg_dump_restored_into_another_cluster_renumbers_and_refuses_old_cursors(
    pg_databases: PgDatabases | None, vault: Vault
) -> None:
    """A pg_dump restored into another cluster refuses old cursors and feeds every row from 0."""
    if pg_databases is None or shutil.which("pg_dump") is None:
        pytest.skip("needs PostgreSQL (LTA_TEST_DATABASE_URL) and pg_dump")
    source, target = pg_databases.create(), pg_databases.create()
    with Store.open(source) as store:
        store.upgrade()
        a = enroll(store, vault, "a").id
        store.apply([read(a, 1, latest_change={"v": 1})])
        store.apply([read(a, 2, latest_change={"v": 2})])
        cursor, _ = take(store, 0)
    dump = subprocess.run(["pg_dump", "--no-owner", source], check=True, capture_output=True)
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", target], input=dump.stdout, check=True)
    moved = 10**12
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("UPDATE feed_counter SET pg_system = '1'")
        conn.execute("UPDATE history SET seq = seq + %s", (moved,))
    history, _, at = cursor.rpartition(".")
    old = f"{history}.{int(at) + moved}"
    with Store.open(target) as store:
        with pytest.raises(CursorError) as raised:
            store.changed_since(old)
        assert raised.value.reason == "ahead"
        store.upgrade()
        with pytest.raises(CursorError) as raised:
            store.changed_since(old)
        assert raised.value.reason == "other_database"
        fresh, rows = take(store, 0)
        assert [r[2] for r in rows] == [{"v": 1}, {"v": 2}]
        store.apply([read(a, 3, latest_change={"v": 3})])
        assert take(store, fresh)[1] == [("a", "latest-change", {"v": 3})]


@pytest.mark.postgres
def test_a_role_that_may_not_read_the_cluster_id_still_upgrades_and_feeds(
    pg_databases: PgDatabases | None, vault: Vault
) -> None:
    """A role without `pg_control_system()` still upgrades, feeds and checks for restores."""
    if pg_databases is None:
        pytest.skip("needs PostgreSQL (LTA_TEST_DATABASE_URL)")
    url = pg_databases.create()
    role = f"lta_plain_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" OWNER TO "{role}"')
            admin.execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
            plain = url.replace("postgres@", f"{role}@", 1)
            with Store.open(plain) as store:
                store.upgrade()
                store.upgrade()  # the restore check again, with its stamp unreadable
                a = enroll(store, vault, "a").id
                store.apply([read(a, 1, latest_change={"v": 1})])
                assert take(store, 0)[1] == [("a", "latest-change", {"v": 1})]
        finally:
            admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" OWNER TO CURRENT_USER')
            admin.execute(f'DROP OWNED BY "{role}" CASCADE')
            admin.execute(f'DROP ROLE "{role}"')
