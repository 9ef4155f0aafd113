"""Several worker processes on one database: one simulator served on loopback (real clock),
one throwaway PostgreSQL database, users enrolled through the real consent flow in-process,
and `lta-worker` child processes with their own config files and log files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from lta_worker.config import Settings, build_settings
from lta_worker.runtime import Runtime
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    LogEntry,
    RunningSimulator,
    Simulator,
    SimulatorTransport,
    SystemClock,
    start_in_thread,
)
from lta_worker.storage import Store, generate_key_line
from support import FIXED_POLL
from support.enroll import write_private
from support.pg import PG_ENV, PG_SKIP, throwaway_database

REDIRECT_URI = "http://127.0.0.1/lta/callback"
READ_PATH = "/api/v1/history/"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """An empty, migrated PostgreSQL database of its own; skipped without a server."""
    admin = os.environ.get(PG_ENV)
    if not admin:
        pytest.skip(PG_SKIP)
    with throwaway_database(admin) as url:
        with Store.open(url) as store:
            store.upgrade()
        yield url


@pytest.fixture
def served() -> Iterator[RunningSimulator]:
    """A simulator on the real clock, served by uvicorn on a loopback port."""
    with start_in_thread(Simulator(clock=SystemClock())) as running:
        yield running


@dataclass
class Worker:
    """One `lta-worker` child process and the files it logs to."""

    name: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log events it wrote (of one name when given); other lines are skipped."""
        found = []
        for line in self.stderr.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
        return found

    def has_logged(self, name: str) -> bool:
        """Whether it wrote an event of that name (cheap enough to poll)."""
        return f'"event": "{name}"' in self.stderr.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Its exit code; killed (and the test failed) when it runs past `timeout`."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            pytest.fail(f"{self.name} still ran after {timeout} s:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        """The end of its stderr, for failure messages."""
        return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Fleet:
    """The shared simulator and database, the config of each worker, and the workers run."""

    served: RunningSimulator
    db_url: str
    tmp: Path
    poll: dict[str, Any] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.secret_file = write_private(self.tmp / "client-secret", DEMO_CLIENT_SECRET + "\n")
        key_line = generate_key_line(datetime.now(UTC))
        self.key_file = write_private(self.tmp / "token-keys", key_line + "\n")

    @property
    def sim(self) -> Simulator:
        return self.served.sim

    def data(self) -> dict[str, dict[str, Any]]:
        """The settings every worker gets (its config file holds the same)."""
        return {
            "service": {"base_url": self.served.base_url, "auth_url": self.served.auth_url},
            "client": {
                "id": DEMO_CLIENT_ID,
                "secret_file": str(self.secret_file),
                "redirect_uri": REDIRECT_URI,
            },
            "database": {"url": self.db_url},
            "crypto": {"key_file": str(self.key_file)},
            "poll": {"concurrency": 4, "batch_size": 10, **FIXED_POLL, **self.poll},
            "ratelimit": {"reserve": 0.1},
            "serve": {"heartbeat": "1s"},
            "log": {"level": "info", "format": "json"},
        }

    def settings(self) -> Settings:
        return build_settings(self.data())

    def config_file(self, name: str) -> Path:
        """Write the worker's own config file (TOML)."""
        lines: list[str] = []
        for section, values in self.data().items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
            lines.append("")
        return write_private(self.tmp / f"{name}.toml", "\n".join(lines))

    def start(self, name: str, *args: str) -> Worker:
        """Start `lta-worker --config <its file> <args>` in a child process."""
        config = self.config_file(name)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
        env.pop("CREDENTIALS_DIRECTORY", None)
        stdout, stderr = self.tmp / f"{name}.out", self.tmp / f"{name}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "lta_worker", "--config", str(config), *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        worker = Worker(name, process, stdout, stderr)
        self.workers.append(worker)
        return worker

    def stop_all(self) -> None:
        """Kill whatever still runs (a failed test must not leave processes behind)."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGKILL)
                worker.process.wait(timeout=10)

    def store(self) -> Store:
        return Store.open(self.db_url)

    async def enroll(self, users: list[str]) -> None:
        """Enroll each account through the real consent flow in-process (`enroll url`, `finish`)."""
        transport = SimulatorTransport(self.sim)
        async with Runtime(self.settings(), transport=transport) as runtime:
            enrollment, http = runtime.enrollment(), runtime.http

            async def one(user: str) -> None:
                async with limiter:
                    self.sim.add_user(user)
                    url = await anyio.to_thread.run_sync(enrollment.start, user)
                    async with consenting:  # consents are queued first in, first out
                        self.sim.queue_consent(user)
                        consent = await http.get(url)
                    await enrollment.finish(user, consent.headers["location"])

            limiter, consenting = anyio.Semaphore(8), anyio.Lock()
            async with anyio.create_task_group() as tg:
                for user in users:
                    tg.start_soon(one, user)

    def reads(self) -> list[LogEntry]:
        """Every read the simulator saw (both endpoints), oldest first."""
        return [e for e in self.sim.requests() if e.path.startswith(READ_PATH)]

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        """Poll `check` (bounded in time) until it holds; fail with `what` otherwise."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}")
            for worker in self.workers:
                if worker.process.poll() not in (None, 0):
                    pytest.fail(f"{worker.name} exited early:\n{worker.tail()}")
            time.sleep(0.05)


def per_window(reads: list[LogEntry], window: int) -> Counter[int]:
    """Reads counted in each of the server's fixed windows (aligned to the epoch)."""
    return Counter(int(e.at.timestamp() // window) for e in reads)


@pytest.fixture
def fleet(served: RunningSimulator, pg_url: str, tmp_path: Path) -> Iterator[Fleet]:
    """The simulator, a PostgreSQL database and the files workers need; kills leftovers."""
    fleet = Fleet(served, pg_url, tmp_path)
    try:
        yield fleet
    finally:
        fleet.stop_all()
