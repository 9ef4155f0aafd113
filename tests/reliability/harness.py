"""The reliability suite's harness: a deployment on disk, the CLI as a real process, and the
invariants checked on the SQLite file after every crash.

A `Deployment` is what an operator has: a config file, a client secret file and a key file
(mode 0600), a SQLite database, and the simulator served on a loopback port. Users are
enrolled in-process through the real consent flow over loopback HTTP, and the plaintext of
every long term token is remembered, so that after a crash the harness can prove each token
is still there and still decrypts to what the service issued.

`inspect` reads the database with the plain `sqlite3` module (not the worker's code) in one
read transaction, and `violations` turns what it read into a list of broken invariants:

- `integrity`: `PRAGMA integrity_check` is not `ok`, or the file cannot be read at all;
- `token lost`: a user who was not revoked or dropped (an active one included) has no token,
  or its token does not decrypt to the token the service issued, or a user the service never
  revoked is marked revoked;
- `half-written`: a row breaks a rule that only a torn write can break (a token without its
  key id or the reverse, a revoked or dropped user still holding a token);
- `snapshot lost`: a snapshot seen committed before a crash is gone, or went back in time;
- `duplicate history`: two consecutive history rows of one (user, endpoint) with the same
  status and content hash (a replay that was not idempotent).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from lta_worker.config import load_settings
from lta_worker.domain import EncryptedToken
from lta_worker.enrollment import Enrollment
from lta_worker.secret import Secret
from lta_worker.simulator import RunningSimulator, Simulator, start_in_thread
from lta_worker.storage import Store, Vault, generate_key_line, load_key_file
from lta_worker.upstream import ApiClient, http_client
from support import FIXED_POLL

REDIRECT = "http://127.0.0.1/lta/callback"
ITERATIONS_ENV = "LTA_RELIABILITY_ITERATIONS"
SEED_ENV = "LTA_RELIABILITY_SEED"
DEFAULT_SEED = 20_240_601
TOKENLESS = frozenset({"revoked", "dropped"})
# Generous: only a hung process should ever reach it.
PROCESS_TIMEOUT = 90.0


def seed() -> int:
    """The suite's random seed (`LTA_RELIABILITY_SEED`, else a fixed one): runs repeat."""
    return int(os.environ.get(SEED_ENV, DEFAULT_SEED))


def write_private(path: Path, text: str) -> Path:
    """Write a file readable by its owner only (mode 0600)."""
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o600)
    return path


def toml_value(value: Any) -> str:
    """A Python value as TOML (strings, numbers, booleans, lists of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def render_toml(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """A config file from sections of keys (a value of None leaves the key out)."""
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


@dataclass
class Output:
    """What one command printed."""

    label: str
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        """The JSON log events in stderr."""
        out = []
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def event_names(self) -> list[str]:
        """The names of the JSON log events, in order."""
        return [str(e.get("event")) for e in self.events]


@dataclass
class Spawned:
    """A command running in the background; stdout and stderr go to files."""

    label: str
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    started: float

    def stderr(self) -> str:
        """What it printed on stderr so far."""
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float = PROCESS_TIMEOUT) -> int:
        """Wait for the exit; a process still running after `timeout` is killed (and fails)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise

    def signal(self, signum: int) -> None:
        """Send a signal (nothing when it already exited)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def output(self) -> Output:
        """The finished command's output."""
        return Output(
            self.label,
            self.process.returncode,
            self.stdout_path.read_text(encoding="utf-8", errors="replace"),
            self.stderr(),
        )


@dataclass
class Deployment:
    """An operator's installation of lta-worker, against a simulator on loopback."""

    tmp: Path
    running: RunningSimulator
    client_id: str
    client_secret: str
    secret_file: Path
    key_file: Path
    database: Path
    config: Path
    sections: dict[str, dict[str, Any]]
    tokens: dict[str, str] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    _spawned: int = 0

    @property
    def sim(self) -> Simulator:
        """The simulator (drive it directly: faults, revocations, payloads)."""
        return self.running.sim

    @property
    def db_url(self) -> str:
        """The SQLAlchemy URL of the database."""
        return f"sqlite:///{self.database}"

    def configure(self, **sections: Mapping[str, Any]) -> Path:
        """Merge settings into the config file (`poll={"interval": "1s"}`) and rewrite it."""
        for section, values in sections.items():
            self.sections.setdefault(section, {}).update(values)
        self.config.write_text(render_toml(self.sections), encoding="utf-8")
        return self.config

    def write_config(self, path: Path, **sections: Mapping[str, Any]) -> Path:
        """Another config file: this deployment's settings with `sections` merged over them."""
        merged = {s: dict(v) for s, v in self.sections.items()}
        for section, values in sections.items():
            merged.setdefault(section, {}).update(values)
        path.write_text(render_toml(merged), encoding="utf-8")
        return path

    def env(self, config: Path | None = None) -> dict[str, str]:
        """The environment of a child process: no stray LTA_WORKER_ settings, this config."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LTA_WORKER_") and k != "CREDENTIALS_DIRECTORY"
        }
        env["LTA_WORKER_CONFIG"] = str(config or self.config)
        return env

    def cli(
        self,
        *args: str,
        stdin: str = "",
        config: Path | None = None,
        timeout: float = PROCESS_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> Output:
        """Run `python -m lta_worker ARGS` to its end; keep what it printed."""
        done = subprocess.run(
            [sys.executable, "-m", "lta_worker", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**self.env(config), **(env or {})},
            timeout=timeout,
            check=False,
        )
        out = Output(" ".join(args), done.returncode, done.stdout, done.stderr)
        self.outputs.append(out)
        return out

    def spawn(self, *args: str, config: Path | None = None) -> Spawned:
        """Start `python -m lta_worker ARGS` in the background."""
        self._spawned += 1
        stem = self.tmp / f"proc{self._spawned:03d}"
        out_path, err_path = stem.with_suffix(".out"), stem.with_suffix(".err")
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "lta_worker", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self.env(config),
            )
        return Spawned(" ".join(args), process, out_path, err_path, time.monotonic())

    def keep(self, spawned: Spawned) -> Output:
        """Record a finished background command's output with the others."""
        out = spawned.output()
        self.outputs.append(out)
        return out

    def vault(self) -> Vault:
        """A vault over the key file as it is now."""
        return Vault(load_key_file(self.key_file))

    def enroll(
        self, users: Iterable[str], scopes: list[str] | None = None, *, sim_user: str | None = None
    ) -> None:
        """Create each account in the simulator and enroll it through the consent flow over
        loopback HTTP (in-process, for speed); remember each issued token's plaintext.

        With `sim_user`, every local user consents as that existing account instead (which
        rotates its token: the one stored for its earlier local user stops working).
        """
        users = list(users)
        if sim_user is None:
            for user in users:
                self.sim.add_user(user)
        anyio.run(self._enroll, users, scopes, sim_user)

    async def _enroll(
        self, users: list[str], scopes: list[str] | None, sim_user: str | None
    ) -> None:
        settings = load_settings(self.config, {})
        vault = self.vault()
        with Store.open(self.db_url) as store:
            store.upgrade()
            async with http_client(settings.service) as http:
                enrollment = Enrollment(
                    settings.client,
                    store,
                    vault,
                    ApiClient(http, settings.service, settings.client, Secret(self.client_secret)),
                    lambda: datetime.now(UTC),
                    auth_url=settings.service.auth_url,
                )
                for user in users:
                    url = enrollment.start(user)
                    self.sim.queue_consent(sim_user or user, scopes)
                    location = (await http.get(url)).headers["location"]
                    await enrollment.finish(user, location)
            for user in users:
                row = store.get_user(user)
                assert row is not None
                assert row.token is not None
                self.tokens[user] = vault.decrypt(row.token, user=user).reveal()

    def plant_tokens(self, count: int, prefix: str = "planted") -> None:
        """Store `count` users with random tokens straight through the store (the service
        does not know them: for tests that never read, such as key rotation)."""
        vault = self.vault()
        now = datetime.now(UTC)
        far = now.replace(year=now.year + 1)  # never due
        with Store.open(self.db_url) as store:
            store.upgrade()
            for i in range(count):
                user = f"{prefix}{i:04d}"
                token = "dspa_" + secrets.token_urlsafe(32)
                encrypted = vault.encrypt(Secret(token), user=user)
                store.store_token(user, encrypted, ["cloud-sync.permanent.stats"], now, far)
                self.tokens[user] = token

    def db_files(self) -> list[Path]:
        """The database and its companions (-wal, -shm, lock) that exist now."""
        names = [self.database.name + s for s in ("", "-wal", "-shm", ".lock")]
        return [p for p in (self.database.with_name(n) for n in names) if p.exists()]


def make_deployment(
    tmp: Path,
    running: RunningSimulator,
    *,
    client_id: str,
    client_secret: str,
    **sections: Mapping[str, Any],
) -> Deployment:
    """Files for one installation: secret file, key file (0600), config (JSON logs, debug)."""
    tmp.mkdir(parents=True, exist_ok=True)
    secret_file = write_private(tmp / "client-secret", client_secret + "\n")
    key_file = write_private(tmp / "token-keys", generate_key_line(datetime.now(UTC)) + "\n")
    database = tmp / "lta.db"
    base: dict[str, dict[str, Any]] = {
        "service": {
            "base_url": running.base_url,
            "auth_url": running.auth_url,
            "connect_timeout": "2s",
            "read_timeout": "2s",
        },
        "client": {
            "id": client_id,
            "secret_file": str(secret_file),
            "redirect_uri": REDIRECT,
        },
        "database": {"url": f"sqlite:///{database}"},
        "crypto": {"key_file": str(key_file)},
        "poll": {"concurrency": 4, "batch_size": 5, **FIXED_POLL},
        "log": {"level": "debug", "format": "json"},
        "serve": {"grace_period": "2s"},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    config = tmp / "lta-worker.toml"
    deployment = Deployment(
        tmp=tmp,
        running=running,
        client_id=client_id,
        client_secret=client_secret,
        secret_file=secret_file,
        key_file=key_file,
        database=database,
        config=config,
        sections=base,
    )
    deployment.configure()
    return deployment


def serve_simulator(*, budget: int = 10_000_000, seed_value: int | None = None) -> RunningSimulator:
    """A simulator on a loopback port with a budget too large to matter (unless given)."""
    sim = Simulator(seed=seed_value)
    sim.configure(budget=budget, window=3600)
    return start_in_thread(sim)


# -- reading the database and checking invariants ------------------------------------------


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
    """Every broken invariant (see the module docstring), in words; [] when all hold.

    Args:
        seen: what `inspect` read.
        vault: decrypts the stored tokens.
        tokens: the plaintext the service issued, per user.
        revoked: users the service revoked (their token may legitimately be gone).
        acknowledged: the newest `fetched_at` seen committed per (user, endpoint) before.
    """
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


def wait_for(predicate: Callable[[], object], *, timeout: float, interval: float = 0.02) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; return whether it was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def reads_seen(sim: Simulator) -> int:
    """How many reads (either endpoint) the simulator has logged."""
    return sum(1 for e in sim.requests() if "/api/v1/history/" in e.path)


def wait_for_reads(
    sim: Simulator, more_than: int, *, timeout: float = 30.0, run: Spawned | None = None
) -> bool:
    """Wait until the simulator has logged more than `more_than` reads (or, given `run`,
    until that process has ended: a run that found nobody due reads nothing); return
    whether reads came."""
    wait_for(
        lambda: reads_seen(sim) > more_than or (run is not None and run.process.poll() is not None),
        timeout=timeout,
    )
    return reads_seen(sim) > more_than


def kill(spawned: Spawned) -> int:
    """SIGKILL the process and reap it; return its exit status."""
    spawned.signal(signal.SIGKILL)
    return spawned.wait(30)


def rng(offset: int = 0) -> random.Random:
    """A generator seeded from the suite's seed (plus an offset per test)."""
    return random.Random(seed() + offset)
