"""SQLite stays single-instance: while one `run` works on a database file, a second `run` or
`serve` on the same file refuses to start with a clear message and exit 75; and since the
lock proves a killed run dead, the next run takes back what it had leased at once."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select

from lta_worker.simulator import RunningSimulator
from lta_worker.storage import Store, User, UserLease

from .conftest import Fleet


@pytest.mark.timeout(60)
@pytest.mark.parametrize("second", ["run", "serve"])
def test_a_second_worker_on_the_same_sqlite_file_refuses(
    served: RunningSimulator, tmp_path: Path, second: str
) -> None:
    """A second `run` or `serve` on a SQLite file in use exits 75 at once, saying why."""
    database = tmp_path / "lta.db"
    fleet = Fleet(served, f"sqlite:///{database}", tmp_path)
    try:
        served.sim.configure(budget=2, window=3600)  # the first run waits long for permits
        anyio.run(fleet.enroll, [f"user-{n}" for n in range(3)])
        served.sim.clear_requests()
        first = fleet.start("first", "run", "--max-duration", "10s")
        fleet.wait_for("the first run to read", lambda: len(fleet.reads()) >= 1, timeout=30)
        refused = fleet.start("second", second)
        assert refused.wait(timeout=30) == 75
        message = refused.stderr.read_text()
        assert "another lta-worker run or serve is already working on" in message
        assert str(database) in message
        assert "PostgreSQL" in message  # the hint says what several instances need
        assert first.process.poll() is None  # still working, undisturbed
        assert first.wait(timeout=30) == 75  # its deadline: the rest stays due
        assert {e.user for e in fleet.reads()} <= {f"user-{n}" for n in range(3)}
    finally:
        fleet.stop_all()


@pytest.mark.timeout(60)
def test_the_next_run_reads_what_a_killed_run_had_leased(
    served: RunningSimulator, tmp_path: Path
) -> None:
    """After a `run` killed with -9 the next run takes its leases back at once, on SQLite."""
    users = [f"user-{n}" for n in range(6)]
    fleet = Fleet(served, f"sqlite:///{tmp_path / 'lta.db'}", tmp_path)
    try:
        served.sim.configure(budget=2, window=3600)  # the first run holds its users, waiting
        anyio.run(fleet.enroll, users)
        served.sim.clear_requests()
        killed = fleet.start("killed", "run")
        fleet.wait_for("the first reads", lambda: len(fleet.reads()) >= 2, timeout=30)
        killed.process.send_signal(signal.SIGKILL)
        killed.process.wait(timeout=10)
        instance = killed.events("pass.started")[0]["instance"]
        with fleet.store() as store:
            leased = [u for u in users if _lease_owner(store, u) == instance]
        assert leased
        served.sim.configure(budget=1000, window=60)  # a new window length: counts reset
        nxt = fleet.start("next", "run")
        assert nxt.wait(timeout=30) == 0, nxt.tail()
        expired = nxt.events("instance.lease_expired")
        assert [(e["instance"], e["users"]) for e in expired] == [(instance, len(leased))]
        with fleet.store() as store:
            read = {r.user for r in store.export_results() if r.status == "ok"}
            assert read == set(users)
            assert all(_lease_owner(store, u) is None for u in users)
    finally:
        fleet.stop_all()


def _lease_owner(store: Store, user: str) -> str | None:
    with store.database.read() as conn:
        owner: str | None = conn.execute(
            select(UserLease.owner)
            .join(User, User.id == UserLease.user_id)
            .where(User.user == user)
        ).scalar_one_or_none()
    return owner
