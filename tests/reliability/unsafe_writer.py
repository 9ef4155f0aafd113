"""Deliberately unsafe writers for the kill -9 negative controls (`python unsafe_writer.py MODE
DATABASE`): each damages the database as a careless writer would (delete-then-insert,
token-null-then-set, replay-history, torn-page), prints `ready` and waits to be killed."""

from __future__ import annotations

import os
import sqlite3
import sys
import time

PAGE = 4096
WAIT_FOR_KILL_S = 60.0


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def _ready_then_wait() -> None:
    print("ready", flush=True)
    time.sleep(WAIT_FOR_KILL_S)  # the harness kills the process here


def delete_then_insert(path: str) -> None:
    """Step one of a two-commit rewrite; the INSERT never comes."""
    conn = _connect(path)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DELETE FROM snapshots")
    conn.execute("COMMIT")
    _ready_then_wait()


def token_null_then_set(path: str) -> None:
    """Step one of a two-commit re-encryption; the new ciphertext never comes."""
    conn = _connect(path)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "UPDATE users SET token_ciphertext = NULL, token_key_id = NULL WHERE state = 'active'"
    )
    conn.execute("COMMIT")
    _ready_then_wait()


def replay_history(path: str) -> None:
    """Append each (user, endpoint)'s last content again, as a replay that checks nothing."""
    conn = _connect(path)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO history (user_id, endpoint, status, payload, content_hash, fetched_at) "
        "SELECT user_id, endpoint, status, payload, content_hash, "
        "strftime('%Y-%m-%d %H:%M:%f', fetched_at, '+1 second') FROM history h "
        "WHERE id = (SELECT max(id) FROM history g "
        "WHERE g.user_id = h.user_id AND g.endpoint = h.endpoint)"
    )
    conn.execute("COMMIT")
    _ready_then_wait()


def torn_page(path: str) -> None:
    """Overwrite the first half of every page after the schema page, as an unjournaled
    writer cut off mid-page would leave them (the second halves keep their old bytes)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        for offset in range(PAGE, size, PAGE):
            fh.seek(offset)
            fh.write(b"\x5a" * (PAGE // 2))
        fh.flush()
        os.fsync(fh.fileno())
    _ready_then_wait()


MODES = {
    "delete-then-insert": delete_then_insert,
    "token-null-then-set": token_null_then_set,
    "replay-history": replay_history,
    "torn-page": torn_page,
}


if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[2])
