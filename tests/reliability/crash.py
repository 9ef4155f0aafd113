"""Crash checks of the reliability suite: a deployment with the suite's settings, the seed, and
the invariants read on the SQLite file after every kill -9 or SIGTERM.

`inspect` reads the database with the plain `sqlite3` module (not the worker's code) in one read
transaction; `violations` lists the broken invariants: `integrity` (`integrity_check` not `ok`, or
the file unreadable); `token lost` (a user neither revoked nor dropped without the token the
service issued, or revoked though the service never did); `half-written` (a token without its key
id or the reverse, a revoked or dropped user still holding one); `snapshot lost` (a snapshot seen
committed is gone or went back in time); `duplicate history` (two consecutive history rows of one
(user, endpoint) with the same status and content hash: a replay that was not idempotent).
"""

from __future__ import annotations

import itertools
import os
import random
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lta_worker.domain import EncryptedToken
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET, RunningSimulator
from lta_worker.storage import Vault
from support.process import Workspace

ITERATIONS_ENV = "LTA_RELIABILITY_ITERATIONS"
SEED_ENV = "LTA_RELIABILITY_SEED"
DEFAULT_SEED = 20_240_601
TOKENLESS = frozenset({"revoked", "dropped"})
# The suite's settings: short timeouts, JSON logs at debug (`poll.read` events), a short grace.
BASE: dict[str, dict[str, Any]] = {
    "service": {"connect_timeout": "2s", "read_timeout": "2s"},
    "poll": {"concurrency": 4, "batch_size": 5},
    "log": {"level": "debug"},
    "serve": {"grace_period": "2s"},
}


def seed() -> int:
    """The suite's random seed (`LTA_RELIABILITY_SEED`, else a fixed one): runs repeat."""
    return int(os.environ.get(SEED_ENV, DEFAULT_SEED))


def rng(offset: int = 0) -> random.Random:
    """A generator seeded from the suite's seed (plus an offset per test)."""
    return random.Random(seed() + offset)


def deploy(
    tmp: Path,
    running: RunningSimulator,
    *,
    client_id: str = DEMO_CLIENT_ID,
    client_secret: str = DEMO_CLIENT_SECRET,
    **sections: Mapping[str, Any],
) -> Workspace:
    """A workspace with the suite's settings, `sections` merged over them."""
    made = Workspace(running, tmp, client_id, client_secret)
    made.configure(**BASE)
    made.configure(**sections)
    return made


@dataclass(frozen=True)
class UserSeen:
    """One user row, as stored."""

    user: str
    state: str
    ciphertext: bytes | None
    key_id: str | None
    next_due_at: datetime | None
    last_polled_at: datetime | None
    lease_owner: str | None


@dataclass(frozen=True)
class Seen:
    """What one read transaction saw in the database."""

    users: dict[str, UserSeen]
    snapshots: dict[tuple[str, str], tuple[datetime, str]]
    history: dict[tuple[str, str], list[tuple[str, str, datetime, int]]]
    instances: list[str]
    integrity: str

    def leased_by(self, pid: int) -> list[str]:
        """Users leased by the instance of process `pid` (ids are `host:pid:suffix`)."""
        return [u for u, r in self.users.items() if r.lease_owner and _pid(r.lease_owner) == pid]

    def instances_of(self, pid: int) -> list[str]:
        """Registered instances of process `pid`."""
        return [i for i in self.instances if _pid(i) == pid]


def _pid(instance: str) -> int | None:
    parts = instance.split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def _stamp(value: object) -> datetime | None:
    if value is None:
        return None
    stamp = datetime.fromisoformat(str(value))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def connect(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection (autocommit; BEGIN is explicit) that waits for locks."""
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def inspect(path: Path, *, integrity: bool = True) -> Seen:
    """Read users, snapshots, history and `integrity_check` in one read transaction.

    A file SQLite cannot read at all comes back with `integrity` set to the error.
    """
    try:
        conn = connect(path)
    except sqlite3.Error as exc:
        return Seen({}, {}, {}, [], f"cannot open: {exc}")
    try:
        conn.execute("BEGIN")
        users = {
            r[0]: UserSeen(r[0], r[1], r[2], r[3], _stamp(r[4]), _stamp(r[5]), r[6])
            for r in conn.execute(
                "SELECT user, state, token_ciphertext, token_key_id, next_due_at, "
                "last_polled_at, l.owner FROM users LEFT JOIN user_leases l ON l.user_id = id"
            )
        }
        snapshots = {
            (r[0], r[1]): (_stamp(r[2]), r[3])
            for r in conn.execute(
                "SELECT u.user, s.endpoint, s.fetched_at, s.content_hash "
                "FROM snapshots s JOIN users u ON u.id = s.user_id"
            )
        }
        history: dict[tuple[str, str], list[tuple[str, str, datetime, int]]] = {}
        for r in conn.execute(
            "SELECT u.user, h.endpoint, h.status, h.content_hash, h.fetched_at, h.id "
            "FROM history h JOIN users u ON u.id = h.user_id ORDER BY h.fetched_at, h.id"
        ):
            history.setdefault((r[0], r[1]), []).append((r[2], r[3], _stamp(r[4]), r[5]))
        instances = [r[0] for r in conn.execute("SELECT instance_id FROM instances")]
        check = "ok"
        if integrity:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            check = "; ".join(rows)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        return Seen({}, {}, {}, [], f"cannot read: {exc}")
    finally:
        conn.close()
    return Seen(users, snapshots, history, instances, check)


def violations(
    seen: Seen,
    *,
    vault: Vault,
    tokens: Mapping[str, str],
    revoked: Iterable[str] = (),
    acknowledged: Mapping[tuple[str, str], datetime] | None = None,
) -> list[str]:
    """Every broken invariant (see the module docstring) in what `inspect` read, in words; []
    when all hold. `tokens` are the plaintexts the service issued, `revoked` the users whose
    token may be gone, `acknowledged` the newest `fetched_at` seen committed per key before."""
    found: list[str] = []
    if seen.integrity != "ok":
        return [f"integrity: {seen.integrity}"]
    legit = set(revoked)
    for user, issued in tokens.items():
        row = seen.users.get(user)
        if row is None:
            found.append(f"token lost: user {user!r} is gone")
            continue
        if row.state in TOKENLESS:
            if row.state == "revoked" and user not in legit:
                found.append(f"token lost: {user!r} marked revoked but the service never did")
            if row.ciphertext is not None:
                found.append(f"half-written: {user!r} is {row.state} but still holds a token")
            continue
        if row.ciphertext is None or row.key_id is None:
            kind = "half-written" if (row.ciphertext is None) != (row.key_id is None) else ""
            found.append(f"{kind or 'token lost'}: {user!r} is {row.state} without a token")
            continue
        try:
            plain = vault.decrypt(EncryptedToken(bytes(row.ciphertext), row.key_id), user=user)
        except Exception as exc:
            found.append(f"token lost: {user!r} does not decrypt ({type(exc).__name__})")
            continue
        if plain.reveal() != issued:
            found.append(f"token lost: {user!r} decrypts to another token")
    for key, before in (acknowledged or {}).items():
        now = seen.snapshots.get(key)
        if now is None:
            found.append(f"snapshot lost: {key} committed at {before.isoformat()} is gone")
        elif now[0] < before:
            found.append(f"snapshot lost: {key} went back from {before} to {now[0]}")
    for key, rows in seen.history.items():
        for older, newer in itertools.pairwise(rows):
            if (older[0], older[1]) == (newer[0], newer[1]):
                found.append(f"duplicate history: {key} rows {older[3]} and {newer[3]}")
    return found


def acknowledge(
    acknowledged: dict[tuple[str, str], datetime], seen: Seen
) -> dict[tuple[str, str], datetime]:
    """Fold the snapshots of `seen` into the newest committed `fetched_at` per key."""
    for key, (fetched_at, _) in seen.snapshots.items():
        if key not in acknowledged or fetched_at > acknowledged[key]:
            acknowledged[key] = fetched_at
    return acknowledged
