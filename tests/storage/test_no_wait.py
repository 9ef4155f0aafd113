"""`Store.without_waiting`: a SQLite call that meets another connection's lock fails at once
(`StoreBusy`) instead of waiting, loses nothing, and leaves the connection waiting as usual."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest

from lta_worker.domain._model import UserRow, UserUpdate
from lta_worker.errors import StorageError, StoreBusy
from lta_worker.storage._store import Store
from lta_worker.storage._vault import Vault

from .helpers import MINUTE, T0, enroll, keyring


@contextmanager
def write_lock(store: Store) -> Iterator[sqlite3.Connection]:
    """Another connection (an operator's command, say) holding the write lock."""
    path = store.database.path
    assert path is not None
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def claim(store: Store) -> list[UserRow]:
    return list(
        store.claim_due(now=T0, due_before=T0, limit=10, owner="w", lease_until=T0 + MINUTE)
    )


def test_a_claim_meeting_the_lock_fails_at_once(sqlite_store: Store) -> None:
    """Under without_waiting a claim meets the lock: StoreBusy at once, nothing leased."""
    enroll(sqlite_store, Vault(keyring()), "a")
    with write_lock(sqlite_store):
        started = time.monotonic()
        with pytest.raises(StoreBusy), sqlite_store.without_waiting():
            claim(sqlite_store)
        assert time.monotonic() - started < 1.0  # not the 30 s busy timeout
    assert [row.user for row in claim(sqlite_store)] == ["a"]  # it was not leased before


def test_store_busy_is_a_storage_error_for_callers_that_do_not_retry(sqlite_store: Store) -> None:
    """StoreBusy is a StorageError (exit 75): a caller that does not know it stops cleanly."""
    with write_lock(sqlite_store), pytest.raises(StorageError), sqlite_store.without_waiting():
        claim(sqlite_store)


def test_after_a_busy_call_the_connection_waits_for_the_lock_again(sqlite_store: Store) -> None:
    """The busy timeout comes back after the block: a later call waits for a short lock."""
    enroll(sqlite_store, Vault(keyring()), "a")
    with write_lock(sqlite_store), pytest.raises(StoreBusy), sqlite_store.without_waiting():
        claim(sqlite_store)
    with write_lock(sqlite_store) as other:
        threading.Timer(0.3, other.execute, ["COMMIT"]).start()
        started = time.monotonic()
        assert [row.user for row in claim(sqlite_store)] == ["a"]
        assert time.monotonic() - started >= 0.25
        other.execute("BEGIN IMMEDIATE")  # for the context manager's ROLLBACK


def test_a_busy_apply_reports_no_discarded_update(sqlite_store: Store) -> None:
    """An apply that met the lock reports nothing discarded: retried, each update is told once."""
    enroll(sqlite_store, Vault(keyring()), "a")
    (row,) = claim(sqlite_store)
    update = UserUpdate(row.id, "active", T0 + timedelta(hours=1), 0, "ok", generation=999)
    discarded: list[tuple[UserUpdate, str]] = []
    with write_lock(sqlite_store), pytest.raises(StoreBusy), sqlite_store.without_waiting():
        sqlite_store.apply([update], owner="w", now=T0, discarded=discarded)
    assert discarded == []
    sqlite_store.apply([update], owner="w", now=T0, discarded=discarded)
    assert discarded == [(update, "changed")]  # the stale generation, told once


def test_reads_need_no_lock(sqlite_store: Store) -> None:
    """Under WAL a read goes on while another connection writes, without waiting or failing."""
    enroll(sqlite_store, Vault(keyring()), "a")
    with write_lock(sqlite_store), sqlite_store.without_waiting():
        assert sqlite_store.count_due(T0) == 1


def test_outside_the_block_calls_wait_as_before(sqlite_store: Store) -> None:
    """without_waiting is scoped: a call made after the block is not refused."""
    with sqlite_store.without_waiting():
        pass
    with write_lock(sqlite_store) as other:
        threading.Timer(0.2, other.execute, ["COMMIT"]).start()
        claim(sqlite_store)
        other.execute("BEGIN IMMEDIATE")
