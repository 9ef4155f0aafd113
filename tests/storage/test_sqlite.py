"""SQLite specifics: pragmas, files and permissions, the instance lock, WAL, concurrent writers."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lta_worker.domain import PendingEnrollment
from lta_worker.errors import InstanceLockedError
from lta_worker.secret import Secret
from lta_worker.storage import Store, Vault
from lta_worker.storage._store import lock_file
from support.storage import MINUTE, T0, enroll, keyring, read_turn, token_for

WRITERS = 4
WRITES = 500


def test_pragmas(sqlite_store: Store) -> None:
    """Connections use WAL, a busy timeout, synchronous=FULL and foreign keys."""
    raw = sqlite_store.database.engine.raw_connection()
    try:
        cursor = raw.cursor()
        got = {}
        for pragma in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys"):
            cursor.execute(f"PRAGMA {pragma}")
            got[pragma] = cursor.fetchone()[0]
    finally:
        raw.close()
        sqlite_store.close()
    assert got == {
        "journal_mode": "wal",
        "synchronous": 2,
        "busy_timeout": 30000,
        "foreign_keys": 1,
    }


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
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


def test_a_claim_waits_for_a_short_lock_then_goes_on(sqlite_store: Store) -> None:
    """Under WAL a read goes on while another connection holds the write lock; a claim waits
    for the lock (busy timeout), then claims."""
    enroll(sqlite_store, Vault(keyring()), "a")
    with write_lock(sqlite_store) as other:
        assert sqlite_store.count_due(T0) == 1
        threading.Timer(0.3, other.execute, ["COMMIT"]).start()
        started = time.monotonic()
        rows = sqlite_store.claim_due(
            now=T0, due_before=T0, limit=10, owner="w", lease_until=T0 + MINUTE
        )
        assert [row.user for row in rows] == ["a"]
        assert time.monotonic() - started >= 0.25


def test_missing_parent_directory_is_created_private(tmp_path: Path) -> None:
    """Opening a database under a missing directory creates it (0700) and the file (0600)."""
    path = tmp_path / "var" / "lib" / "lta-worker" / "lta.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.upgrade()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


LOCK_CHILD = """
import sys
from lta_worker.errors import InstanceLockedError
from lta_worker.storage import Store
try:
    with Store.open(sys.argv[1]).single_instance_lock(): print("got it")
except InstanceLockedError: print("locked")
"""


def test_single_instance_lock(sqlite_store: Store) -> None:
    """A second holder, in this process or another, is refused (75) until the first leaves."""
    url = str(sqlite_store.database.engine.url)
    child = [sys.executable, "-c", LOCK_CHILD, url]
    with Store.open(url) as other:
        with sqlite_store.single_instance_lock():
            with pytest.raises(InstanceLockedError) as info, other.single_instance_lock():
                pass
            assert "already working on" in str(info.value)
            assert info.value.exit_code == 75
            held = subprocess.run(child, capture_output=True, text=True, timeout=60, check=True)
        with other.single_instance_lock():
            pass
    free = subprocess.run(child, capture_output=True, text=True, timeout=60, check=True)
    assert (held.stdout.strip(), free.stdout.strip()) == ("locked", "got it")
    assert sqlite_store.database.path is not None
    assert lock_file(sqlite_store.database.path).exists()
    sqlite_store.close()


def test_checkpoint_truncates_wal(sqlite_store: Store) -> None:
    """checkpoint() folds the WAL into the database and truncates it."""
    vault = Vault(keyring())
    for n in range(20):
        enroll(sqlite_store, vault, f"u{n}")
    path = sqlite_store.database.path
    assert path is not None
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 0
    assert sqlite_store.checkpoint() is True
    assert wal.stat().st_size == 0
    sqlite_store.close()


def test_in_memory_database_works(tmp_path: Path) -> None:
    """sqlite:// (in memory) works for throwaway use; the lock and checkpoint are harmless."""
    with Store.open("sqlite://") as store:
        store.upgrade()
        enroll(store, Vault(keyring()), "a")
        with store.single_instance_lock():
            assert store.count_due(T0) == 1


def test_four_processes_500_writes_without_lock_errors(sqlite_store: Store, tmp_path: Path) -> None:
    """4 processes x 500 read-then-write transactions on one file: no 'database is locked'."""
    url = str(sqlite_store.database.engine.url)
    sqlite_store.close()
    script = Path(__file__).with_name("lock_writer.py")
    outputs = [tmp_path / f"writer{n}.out" for n in range(WRITERS)]
    procs = []
    try:
        for n, output in enumerate(outputs):
            with output.open("w") as sink:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(script), url, f"w{n}", str(WRITES)],
                        stdin=subprocess.PIPE,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                )
        started = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        codes = [proc.wait(timeout=100) for proc in procs]
        wall = time.perf_counter() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    texts = [output.read_text() for output in outputs]
    assert codes == [0] * WRITERS, texts
    reports = [json.loads(text) for text in texts]
    assert [r["errors"] for r in reports] == [0] * WRITERS
    print(f"\n{WRITERS}x{WRITES} SQLite write transactions: {wall:.2f}s wall")
    with Store.open(url) as check:
        assert len(list(check.list_users())) == WRITERS * 25


def forms(secret: Secret) -> list[bytes]:
    """The encodings under which a leaked token could sit in a file."""
    raw = secret.reveal().encode()
    return [
        raw,
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw),
        base64.b64encode(raw).rstrip(b"="),
        raw.hex().encode(),
        raw.hex().upper().encode(),
        secret.reveal().encode("utf-16-le"),
    ]


def test_database_files_never_hold_a_token_in_clear(sqlite_store: Store) -> None:
    """After planting tokens and verifiers, no file (db, WAL, shm) holds them in any form."""
    vault = Vault(keyring("k1", "k2"))
    planted: list[Secret] = []
    for n in range(30):
        token = token_for(f"user{n}")
        planted.append(token)
        row = enroll(sqlite_store, vault, f"user{n}", token=token)
        sqlite_store.apply([read_turn(row.id, T0, stats={"n": n})])
    for n in range(5):
        verifier = Secret(os.urandom(32).hex())
        planted.append(verifier)
        state = Secret(f"state-{n}-" + os.urandom(8).hex())
        planted.append(state)
        sqlite_store.save_pending(
            state,
            PendingEnrollment(
                f"p{n}",
                vault.encrypt(verifier, user=f"p{n}", purpose="verifier"),
                "https://app.example/cb",
                T0,
                T0 + MINUTE,
            ),
        )
    sqlite_store.store_token("user0", vault.encrypt(token_for("user0"), user="user0"), [], T0, T0)
    sqlite_store.delete_token("user1", "revoked", T0)
    path = sqlite_store.database.path
    assert path is not None

    def scan() -> int:
        files = [p for p in path.parent.iterdir() if p.name.startswith(path.name)]
        assert any(p.name.endswith("-wal") for p in files) or not files[1:]
        blob = b"".join(p.read_bytes() for p in files)
        for secret in planted:
            for form in forms(secret):
                assert form not in blob
        return len(blob)

    assert scan() > 0  # with the WAL full of recent writes
    sqlite_store.checkpoint()
    sqlite_store.close()
    assert scan() > 0  # after checkpoint and close
