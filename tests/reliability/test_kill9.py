"""kill -9 at seeded moments of `run` and `keys rotate` against a faulty simulator: integrity,
no token or committed snapshot lost, no duplicate history (tests/reliability/crash.py); the
negative controls prove the checks catch each kind of loss."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest

from lta_worker.simulator import RunningSimulator
from support.process import Workspace, reads_seen, wait_for, wait_for_reads

from .crash import acknowledge, connect, deploy, inspect, rng, seed, violations

USERS = 16
KILLS_IN_CI = 10
# Kill moments: in [0, STARTUP_WINDOW_S) after the spawn, or in [0, KILL_WINDOW_S) after the
# pass's first read (a pass of 16 users ends well within a second of it: a wider window left
# too few mid-pass kills).
STARTUP_WINDOW_S = 0.8
KILL_WINDOW_S = 0.6
POLL = {
    "interval": "1s",
    "backoff_base": "1s",
    "lease_duration": "1s",
    "concurrency": 4,
    "batch_size": 5,
}
PAGE = 4096


def _faults(deployment: Workspace) -> None:
    sim = deployment.sim
    sim.clear_faults()
    sim.seed_faults(seed())
    sim.inject_fault("latency", rate=0.5, delay=0.1)
    sim.inject_fault("500", rate=0.04)
    sim.inject_fault("drop", rate=0.03)
    sim.inject_fault("broken_json", rate=0.03)


@pytest.fixture
def deployment(tmp_path: Path, running: RunningSimulator) -> Workspace:
    """16 users enrolled as demo-client; every user due again a second after a read."""
    running.sim.reset()
    running.sim.configure(budget=10_000_000, window=3600)
    made = deploy(
        tmp_path,
        running,
        poll=POLL,
    )
    made.enroll([f"u{i:03d}" for i in range(USERS)])
    return made


def test_kill9_at_random_moments_loses_nothing(deployment: Workspace, iterations: float) -> None:
    """SIGKILL at random moments loses nothing; the next run exits 0 and reads everyone due."""
    target = round(KILLS_IN_CI * iterations)
    chance = rng(1)
    vault = deployment.vault()
    sim = deployment.sim
    revoked: list[str] = []
    acknowledged: dict[tuple[str, str], datetime] = {}
    kills = mid_pass = finished_first = 0
    _faults(deployment)
    for attempt in range(3 * target):
        if kills >= target:
            break
        # Between passes the service moves on: new content for some users, a revocation.
        for user in chance.sample(sorted(deployment.tokens), 6):
            sim.set_payload(user, "stats", {"attempt": attempt, "user": user})
        if attempt % 5 == 4 and len(revoked) < 4:
            user = chance.choice([u for u in sorted(deployment.tokens) if u not in revoked])
            sim.revoke(user)
            revoked.append(user)
        acknowledge(acknowledged, inspect(deployment.database, integrity=False))
        before = reads_seen(sim)
        # Every fourth attempt kills during start-up (imports, schema check, instance
        # registration, first claims), so each run has both classes; the rest a moment of the
        # pass after its first read, so a slow start does not push every kill before the pass.
        during_startup = attempt % 4 == 0
        delay = chance.uniform(0.0, STARTUP_WINDOW_S if during_startup else KILL_WINDOW_S)
        proc = deployment.spawn("run")
        origin = proc.started
        if not during_startup and wait_for_reads(sim, before, timeout=30, run=proc):
            origin = time.monotonic()
        time.sleep(max(0.0, origin + delay - time.monotonic()))
        # What a reader sees committed now must survive the kill that follows at once.
        acknowledge(acknowledged, inspect(deployment.database, integrity=False))
        if proc.process.poll() is not None:
            finished_first += 1
            assert proc.process.returncode in (0, 75), deployment.keep(proc).stderr[-3000:]
            time.sleep(1.1)  # everyone it read is due again (poll.interval = 1s)
            continue
        proc.kill()
        kills += 1
        mid_pass += reads_seen(sim) > before
        found = violations(
            inspect(deployment.database),
            vault=vault,
            tokens=deployment.tokens,
            revoked=revoked,
            acknowledged=acknowledged,
        )
        when = f"{delay:.3f}s after {'the spawn' if during_startup else 'the first read'}"
        assert found == [], f"after kill {kills}, {when} (seed {seed()}): {found}"
    assert kills >= target, f"only {kills} kills landed in {3 * target} attempts"
    assert mid_pass >= target // 2, f"only {mid_pass} of {kills} kills landed mid-pass"

    sim.clear_faults()
    time.sleep(1.1)  # everyone the killed runs read is due again (poll.interval caps a backoff)
    started = datetime.now(UTC)
    # A lease long enough that a busy machine's slow renewal gives up no turn of this run
    # (pass.lease_lapsed: the user stays due, unread); the killed runs keep the 1 s lease.
    final = deployment.other_config(deployment.tmp / "final.toml", poll={"lease_duration": "30s"})
    done = deployment.cli("run", config=final)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [e for e in done.events if e.get("level") == "warning"]
    seen = inspect(deployment.database)
    found = violations(
        seen, vault=vault, tokens=deployment.tokens, revoked=revoked, acknowledged=acknowledged
    )
    assert found == []
    for user in deployment.tokens:
        row = seen.users[user]
        if row.state == "revoked":
            continue
        assert row.state == "active", (user, row.state)
        assert row.last_polled_at is not None and row.last_polled_at >= started, (user, warned)
        assert row.next_due_at is not None and row.next_due_at > started, user
    assert {u for u, r in seen.users.items() if r.state == "revoked"} == set(revoked)
    print(
        f"\nkill -9: {kills} kills ({mid_pass} after reads began), {finished_first} passes "
        f"finished before their kill moment, {len(acknowledged)} snapshots tracked, "
        f"seed {seed()}"
    )


def _under_key(deployment: Workspace, key_id: str) -> int:
    """How many stored tokens are encrypted under `key_id`."""
    users = inspect(deployment.database, integrity=False).users.values()
    return sum(1 for r in users if r.key_id == key_id)


def test_kill9_during_key_rotation_loses_no_token(deployment: Workspace) -> None:
    """SIGKILL at 5 random moments of `keys rotate --batch-size 1`: every token still
    decrypts to the one issued, and the next rotation completes with 0 failed."""
    deployment.plant_tokens(200)  # one commit per token: a rotation of about 0.4 s
    chance = rng(2)
    vault_keys = deployment.key_file
    halfway = 0  # kills that left tokens under two keys: mid-rotation
    for rotation in range(5):
        line = deployment.cli("keys", "generate").stdout
        with vault_keys.open("a", encoding="utf-8") as fh:
            fh.write(line)
        newest = line.partition(":")[0]
        proc = deployment.spawn("keys", "rotate", "--batch-size", "1")
        # Once the first token is under the new key, the rest follow one commit at a time.
        assert wait_for(partial(_under_key, deployment, newest), timeout=20, interval=0.01)
        time.sleep(chance.uniform(0.0, 0.3))
        proc.kill()
        seen = inspect(deployment.database)
        found = violations(seen, vault=deployment.vault(), tokens=deployment.tokens)
        assert found == [], f"after kill {rotation + 1} of a rotation: {found}"
        halfway += 0 < _under_key(deployment, newest) < len(deployment.tokens)
    done = deployment.cli("keys", "rotate")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ", 0 failed" in done.stdout
    assert {r.key_id for r in inspect(deployment.database).users.values()} == {newest}
    print(f"\nkill -9 during keys rotate: 5 kills, {halfway} mid-rotation")


def test_the_run_after_a_kill_reads_its_leased_users_and_forgets_it(deployment: Workspace) -> None:
    """With the default 5-minute lease, the run after a kill -9 takes the dead run for dead
    (on SQLite the lock proves it): it reads every user the dead run had claimed, exits 0, and
    `status` no longer lists the dead instance."""
    deployment.configure(poll={"lease_duration": "5m"})
    deployment.sim.inject_fault("latency", rate=1.0, delay=0.3)
    proc = deployment.spawn("run")
    assert wait_for(lambda: reads_seen(deployment.sim) >= 2, timeout=20)
    proc.kill()
    seen = inspect(deployment.database)
    leased = [u for u, r in seen.users.items() if r.lease_owner]
    assert leased and seen.instances_of(proc.process.pid) != []
    deployment.sim.clear_faults()
    started = datetime.now(UTC)
    done = deployment.cli("run")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = inspect(deployment.database)
    polled = {u: seen.users[u].last_polled_at for u in leased}
    unread = [u for u, at in polled.items() if at is None or at < started]
    assert unread == [], f"the run after the kill exited 0 without reading {unread}"
    status = deployment.here("status", "--format", "json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["instances"] == []


# -- negative controls -----------------------------------------------------------------------


@dataclass
class Settled:
    """A database only the real worker wrote: two clean passes, everything committed."""

    deployment: Workspace
    acknowledged: dict[tuple[str, str], datetime]

    def check(self, database: Path) -> list[str]:
        """The invariants on `database`, against this deployment's tokens and snapshots."""
        return violations(
            inspect(database),
            vault=self.deployment.vault(),
            tokens=self.deployment.tokens,
            acknowledged=self.acknowledged,
        )

    def copy(self, where: Path) -> Path:
        """A copy of the database (it was closed cleanly: no WAL to copy)."""
        where.mkdir(parents=True)
        shutil.copy2(self.deployment.database, where / "lta.db")
        return where / "lta.db"


@pytest.fixture(scope="module")
def settled(tmp_path_factory: pytest.TempPathFactory, running: RunningSimulator) -> Settled:
    """12 users read in two clean passes (new content each time, so history has rows)."""
    running.sim.reset()
    running.sim.configure(budget=10_000_000, window=3600)
    made = deploy(
        tmp_path_factory.mktemp("settled"),
        running,
        poll={**POLL, "interval": "0.3s", "lease_duration": "30s"},  # a slow renewal skips none
    )
    made.enroll([f"s{i:03d}" for i in range(12)])
    for attempt in range(2):
        for user in made.tokens:
            running.sim.set_payload(user, "stats", {"attempt": attempt, "user": user})
        done = made.cli("run")
        assert done.returncode == 0, done.stderr[-3000:]
        time.sleep(0.35)  # everyone due again (poll.interval = 0.3s)
    return Settled(made, acknowledge({}, inspect(made.database)))


def test_checks_pass_on_a_clean_database(settled: Settled) -> None:
    """The checks report nothing on a database only the real worker wrote (no false alarm)."""
    assert settled.check(settled.deployment.database) == []
    seen = inspect(settled.deployment.database)
    assert all(r.state == "active" for r in seen.users.values())
    assert len(settled.acknowledged) == 2 * len(settled.deployment.tokens)
    assert all(len(rows) == 2 for (_, e), rows in seen.history.items() if e == "stats")


# What a careless writer leaves when killed after the first commit of a two-commit rewrite (or
# a replay that checks nothing): the damage each check must report.
CARELESS = {
    "snapshot lost": "DELETE FROM snapshots",
    "token lost": "UPDATE users SET token_ciphertext = NULL, token_key_id = NULL "
    "WHERE state = 'active'",
    "duplicate history": "INSERT INTO history (user_id, endpoint, status, payload, content_hash, "
    "fetched_at) SELECT user_id, endpoint, status, payload, content_hash, "
    "strftime('%Y-%m-%d %H:%M:%f', fetched_at, '+1 second') FROM history h "
    "WHERE id = (SELECT max(id) FROM history g "
    "WHERE g.user_id = h.user_id AND g.endpoint = h.endpoint)",
}


@pytest.mark.parametrize("expected", [*CARELESS, "integrity"])
def test_control_careless_damage_is_detected(
    settled: Settled, tmp_path: Path, expected: str
) -> None:
    """Negative control: the damage a careless writer leaves (or a torn page, the first half of
    every page after the schema overwritten) is reported by the same checks, on a copy that
    passed them just before."""
    copy = settled.copy(tmp_path / "control")
    assert settled.check(copy) == []
    if expected == "integrity":
        with copy.open("r+b") as fh:
            for offset in range(PAGE, copy.stat().st_size, PAGE):
                fh.seek(offset)
                fh.write(b"\x5a" * (PAGE // 2))
    else:
        conn = connect(copy)
        conn.execute(CARELESS[expected])
        conn.close()
    found = settled.check(copy)
    assert any(f.startswith(expected) for f in found), found


def test_control_wal_deleted_after_a_kill_is_detected(deployment: Workspace) -> None:
    """Negative control: the same kill -9, then the WAL thrown away (as a copy that keeps
    only the main file would): committed snapshots are lost, and the checks say so."""
    vault = deployment.vault()
    acknowledged = acknowledge({}, inspect(deployment.database))
    # Slow answers, so the pass is still running (its WAL not yet checkpointed away by a
    # clean exit) when the kill comes.
    deployment.sim.inject_fault("latency", rate=1.0, delay=0.5)
    proc = deployment.spawn("run")
    assert wait_for(lambda: len(inspect(deployment.database).snapshots) >= 6, timeout=30)
    acknowledge(acknowledged, inspect(deployment.database, integrity=False))
    proc.kill()
    assert (deployment.database.with_name("lta.db-wal")).exists()
    unsafe = deployment.tmp / "unsafe"
    unsafe.mkdir()
    # Copied first: opening the real database after the kill checkpoints its WAL.
    shutil.copy2(deployment.database, unsafe / "lta.db")  # without -wal and -shm

    def check(database: Path) -> list[str]:
        seen = inspect(database)
        return violations(seen, vault=vault, tokens=deployment.tokens, acknowledged=acknowledged)

    assert check(deployment.database) == []  # the real database, after the kill, passes
    found = check(unsafe / "lta.db")
    assert any(f.startswith("snapshot lost") for f in found), found
