"""End-to-end harness: the real `Worker` (store, vault, API client, pacer, engine) against the
simulator in-process, on SQLite (and PostgreSQL for the tests marked `ON_BOTH_BACKENDS`)."""

from __future__ import annotations

import io
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from lta_worker.config import Settings, build_settings
from lta_worker.enrollment import Lifecycle
from lta_worker.runtime import Runtime
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    ManualClock,
    Simulator,
    SimulatorTransport,
    SystemClock,
)
from lta_worker.storage import Store, generate_key_line
from lta_worker.worker import PassResult, Worker
from support import FIXED_POLL
from support.enroll import write_private
from support.pg import PG_ENV, PG_SKIP, throwaway_database
from support.virtual_time import VirtualTime, virtual_backend

BASE_URL = "https://api.sim.example"
AUTH_URL = "https://api.sim.example/auth"
REDIRECT_URI = "https://app.example/lta/callback"


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """asyncio; for a test on `virtual_harness`, trio with its MockClock (virtual time)."""
    return virtual_backend() if "virtual_harness" in request.fixturenames else "asyncio"


class WorkerClock:
    """Wall time from the simulator's clock (due times move with it), real monotonic time."""

    def __init__(self, wall: ManualClock | SystemClock) -> None:
        self.wall = wall

    def now(self) -> Any:
        return self.wall.now()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@dataclass
class Harness:
    """The simulator, the config files, and helpers to enroll users and run passes."""

    sim: Simulator
    clock: ManualClock | SystemClock | VirtualTime
    tmp: Path
    db_url: str
    overrides: dict[str, dict[str, Any]]
    secret_file: Path
    key_file: Path

    def settings(self) -> Settings:
        data: dict[str, dict[str, Any]] = {
            "service": {"base_url": BASE_URL, "auth_url": AUTH_URL},
            "client": {
                "id": DEMO_CLIENT_ID,
                "redirect_uri": REDIRECT_URI,
                "secret_file": str(self.secret_file),
            },
            "database": {"url": self.db_url},
            "crypto": {"key_file": str(self.key_file)},
            "poll": {"concurrency": 4, "batch_size": 10, **FIXED_POLL},
        }
        for section, values in self.overrides.items():  # None: the key is not named
            merged = {**data.get(section, {}), **values}
            data[section] = {k: v for k, v in merged.items() if v is not None}
        return build_settings(data)

    def configure(self, section: str, **values: Any) -> None:
        self.overrides.setdefault(section, {}).update(values)

    def store(self) -> Store:
        store = Store.open(self.db_url)
        store.upgrade()
        return store

    def advance(self, delta: timedelta) -> None:
        assert isinstance(self.clock, ManualClock)
        self.clock.advance(delta.total_seconds())

    async def enroll(
        self, user: str, scopes: list[str] | None = None, *, create: bool = True, **account: Any
    ) -> None:
        """Create the account in the simulator and enroll it through the real consent flow."""
        if create:
            self.sim.add_user(user, **account)
        settings = self.settings()
        transport = SimulatorTransport(self.sim)
        async with Runtime(settings, transport=transport, clock=self.worker_clock()) as runtime:
            enrollment = runtime.enrollment()
            url = enrollment.start(user)
            self.sim.queue_consent(user, scopes)
            location = (await runtime.http.get(url)).headers["location"]
            await enrollment.finish(user, location)

    @asynccontextmanager
    async def lifecycle(
        self, transport: httpx.AsyncBaseTransport | None = None
    ) -> AsyncIterator[Lifecycle]:
        """A Lifecycle on its own runtime (another process would have its own)."""
        transport = transport or SimulatorTransport(self.sim)
        async with Runtime(self.settings(), transport=transport, clock=self.worker_clock()) as rt:
            yield rt.lifecycle()

    def worker(self, transport: httpx.AsyncBaseTransport | None = None, **kwargs: Any) -> Worker:
        """The real Worker through the simulator (or `transport`), on the harness's clock."""
        transport = transport or SimulatorTransport(self.sim)
        return Worker(self.settings(), transport=transport, clock=self.worker_clock(), **kwargs)

    async def run_pass(self, **kwargs: Any) -> PassResult:
        """One pass of the real Worker through the in-process simulator."""
        async with self.worker() as worker:
            return await worker.run_pass(**kwargs)

    def worker_clock(self) -> Any:
        """The worker's clock: the harness's own (virtual time), or the sim's wall time."""
        if isinstance(self.clock, VirtualTime):
            return self.clock
        return WorkerClock(self.clock)

    def reads(self, user: str | None = None) -> list[Any]:
        """The simulator's log of reads (both endpoints), optionally of one user."""
        return [
            e
            for e in self.sim.requests()
            if "/api/v1/history/" in e.path and (user is None or e.user == user)
        ]

    def user(self, user: str) -> Any:
        with self.store() as store:
            row = store.get_user(user)
        assert row is not None
        return row


class Gate(httpx.AsyncBaseTransport):
    """Passes requests to `inner`; holds the first read's answer (with `delete`: the first
    DELETE, unsent) until `release` is set."""

    def __init__(self, inner: httpx.AsyncBaseTransport, *, delete: bool = False) -> None:
        self.inner, self.delete = inner, delete
        self.reached, self.release = anyio.Event(), anyio.Event()
        self._armed = True

    async def _hold(self) -> None:
        self._armed = False
        self.reached.set()
        await self.release.wait()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._armed and self.delete and request.method == "DELETE":
            await self._hold()
        response = await self.inner.handle_async_request(request)
        if self._armed and not self.delete and "/api/v1/history/" in request.url.path:
            self._armed = False
            await response.aread()
            await self._hold()
        return response


# SQLite by default: the storage contract suite runs every store operation on both backends.
# A test whose scenario exercises PostgreSQL-specific code (row locks, leases between
# connections, column bounds) takes `ON_BOTH_BACKENDS` as a mark.
ON_BOTH_BACKENDS = pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if getattr(request, "param", "sqlite") == "sqlite":
        yield f"sqlite:///{tmp_path / 'lta.db'}"
        return
    if not os.environ.get(PG_ENV):
        pytest.skip(PG_SKIP)
    with throwaway_database(os.environ[PG_ENV]) as url:
        yield url


def write_files(
    tmp: Path, secret: str = DEMO_CLIENT_SECRET, at: datetime | None = None
) -> tuple[Path, Path]:
    """The client secret file and a key file (its key made `at`, default now), both 0600."""
    secret_file = write_private(tmp / "client-secret", secret + "\n")
    key_line = generate_key_line(at or SystemClock().now())
    return secret_file, write_private(tmp / "token-keys", key_line + "\n")


@pytest.fixture
def log_stream(_quiet_json_logs: io.StringIO) -> io.StringIO:
    """The rendered JSON log lines (the autouse fixture's stream)."""
    return _quiet_json_logs


def _harness(tmp: Path, db_url: str, clock: ManualClock | SystemClock | VirtualTime) -> Harness:
    return Harness(Simulator(clock=clock), clock, tmp, db_url, {}, *write_files(tmp))


@pytest.fixture
def harness(tmp_path: Path, db_url: str) -> Harness:
    """A simulator on a manual clock with a budget too large to matter."""
    made = _harness(tmp_path, db_url, ManualClock())
    made.sim.configure(budget=1_000_000, window=3600)
    return made


@pytest.fixture
def virtual_harness(tmp_path: Path, db_url: str) -> Harness:
    """A simulator and worker on one virtual clock; the test's body runs inside `autojump()`."""
    return _harness(tmp_path, db_url, VirtualTime())


@pytest.fixture
def realtime_harness(tmp_path: Path, db_url: str) -> Harness:
    """A simulator on the real clock, for budget windows measured in seconds."""
    return _harness(tmp_path, db_url, SystemClock())
