"""`results export --changed-since CURSOR` through the CLI, over every backend: the contents
stored after the cursor, then a last line `{"cursor": N}` that the next call takes; the
history export."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from lta_worker.domain import UserUpdate
from lta_worker.storage import Store, Vault
from support.schemas import line_problems
from support.storage import MINUTE, T0, enroll, keyring, newest_position, position, read_turn

from .test_readonly_cmds import cli, write_config


def read(user_id: int, minute: int, payload: Any) -> UserUpdate:
    """A turn at T0 + `minute` that read `payload` from latest-change."""
    return read_turn(user_id, T0 + minute * MINUTE, latest_change=payload)


def export(config: Path, url: str, cursor: str | int) -> tuple[list[dict[str, Any]], str]:
    """The rows `results export --changed-since CURSOR` printed, and its last line's cursor,
    called again with that cursor until it passed every row stored (on PostgreSQL another
    session's open transaction, a parallel test's, holds the feed back until it ends)."""
    with Store.open(url, read_only=True) as store:
        newest = newest_position(store)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while True:
        args = ("results", "export", "--format", "jsonl", "--changed-since", str(cursor))
        done = cli(config, *args)
        assert done.returncode == 0, done.stderr
        *rows, last = [json.loads(line) for line in done.stdout.splitlines()]
        assert [p for line in (*rows, last) for p in line_problems(line)] == []
        assert set(last) == {"cursor"}
        assert position(last["cursor"]) >= position(cursor)
        out += rows
        cursor = last["cursor"]
        if position(cursor) > newest:
            return out, cursor
        assert time.monotonic() < deadline, "the feed never passed the newest row"


def test_changed_since_prints_the_new_contents_then_the_next_cursor(
    tmp_path: Path, store_url: str
) -> None:
    """--changed-since prints what was stored since the cursor, then the next cursor."""
    config = write_config(tmp_path, store_url)
    with Store.open(store_url) as store:
        alice = enroll(store, Vault(keyring("k1")), "alice").id
        store.apply([read(alice, 1, {"v": 1})])
        store.apply([read(alice, 2, {"v": 2})])
    rows, cursor = export(config, store_url, 0)
    assert [(r["user"], r["endpoint"], r["payload"]) for r in rows] == [
        ("alice", "latest-change", {"v": 1}),
        ("alice", "latest-change", {"v": 2}),
    ]
    assert (rows[0]["state"], rows[0]["fetched_at"]) == ("active", "2025-06-01T12:01:00Z")
    again, same = export(config, store_url, cursor)
    assert (again, position(same) >= position(cursor)) == ([], True)
    with Store.open(store_url) as store:
        store.apply([read(alice, 3, {"v": 2})])  # the same content: no change
        store.apply([read(alice, 4, {"v": 4})])
    rows, later = export(config, store_url, same)
    assert [r["payload"] for r in rows] == [{"v": 4}]
    assert position(later) > position(cursor)
    with Store.open(store_url) as store:
        store.begin_drop("alice", T0 + 5 * MINUTE, purge=True)
    rows, _ = export(config, store_url, later)
    at = "2025-06-01T12:05:00Z"
    assert rows == [{"user": "alice", "forgotten": True, "reason": "forget", "at": at}]


def test_history_since_and_a_stored_infinity(tmp_path: Path, store_url: str) -> None:
    """`--history --user --since` lists one user's contents read since; `--since` alone exits 2;
    a row an older version stored with `Infinity` (SQLite: PostgreSQL's json never took one) is
    left out with a warning, every line strict JSON."""
    config = write_config(tmp_path, store_url)
    with Store.open(store_url) as store:
        vault = Vault(keyring("k1"))
        bad, good = enroll(store, vault, "bad").id, enroll(store, vault, "good").id
        for minute in range(3):
            store.apply([read(good, minute, {"n": minute})])
        store.apply([read(bad, 2, {"n": 1})])
        if store.dialect == "sqlite":
            with store.database.write() as conn:
                conn.execute(
                    text("UPDATE snapshots SET payload = '{\"n\": Infinity}' WHERE user_id = :u"),
                    {"u": bad},
                )
    since = (T0 + MINUTE).isoformat()
    done = cli(config, "results", "export", "--history", "--user", "good", "--since", since)
    assert done.returncode == 0, done.stderr
    payloads = [json.loads(line)["payload"] for line in done.stdout.splitlines()]
    assert payloads == [{"n": 1}, {"n": 2}]
    for bad_args in (("--since", "7d"), ("--history", "--since", "yesterday")):
        assert cli(config, "results", "export", *bad_args).returncode == 2
    if not store_url.startswith("sqlite"):
        return
    done = cli(config, "results", "export")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line, parse_constant=_refuse) for line in done.stdout.splitlines()]
    assert [line["user"] for line in lines] == ["good"]
    skipped = [json.loads(line) for line in done.stderr.splitlines() if "results.skipped" in line]
    assert [(e["user"], e["endpoint"]) for e in skipped] == [("bad", "latest-change")]


def _refuse(constant: str) -> Any:
    raise AssertionError(f"{constant} is not JSON")


@pytest.mark.parametrize(
    ("cursor", "says"),
    [
        (("-1",), "--changed-since"),
        (("yesterday",), "--changed-since"),
        (("0", "--history"), "--changed-since"),
        (("1000000000",), "--changed-since 0"),
        (("ahead",), "--changed-since 0"),
    ],
    ids=["negative", "not-a-number", "with-history", "legacy", "ahead"],
)
def test_a_bad_cursor_is_a_usage_error(
    tmp_path: Path, store_url: str, cursor: tuple[str, ...], says: str
) -> None:
    """A cursor that is not a whole number from 0, or with --history, exits 2 and says so; one
    the database never issued (legacy, ahead) exits 2 naming `--changed-since 0`."""
    config = write_config(tmp_path, store_url)
    if cursor == ("ahead",):
        _, issued = export(config, store_url, 0)
        cursor = (f"{str(issued).rpartition('.')[0]}.{2**62}",)
    done = cli(config, "results", "export", "--changed-since", *cursor)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert says in done.stderr
