"""SQLite stays single-instance: while one `run` works on a database file, a second `run` or
`serve` on the same file refuses to start with a clear message and exit 75 (the next run after a
kill -9: tests/reliability/test_kill9.py, tests/engine/test_lease_stall.py)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from lta_worker.simulator import RunningSimulator

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
