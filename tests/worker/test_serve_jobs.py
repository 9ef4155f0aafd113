"""The `Service` jobs in-process, with a stand-in worker: a failing job is logged as an event
and the service goes on; a stop waits for the running pass instead of cancelling it."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, timedelta
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from structlog.testing import capture_logs

from lta_worker.errors import ConfigError, StorageError
from lta_worker.worker._serve import Service

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordingNotifier:
    """Keeps what would go to systemd."""

    watchdog_interval = None

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def status(self, text: str) -> bool:
        self.sent.append(("status", text))
        return True

    def stopping(self, text: str) -> bool:
        self.sent.append(("stopping", text))
        return True


class StandInWorker:
    """The few things `Service` uses of a `Worker`; `run_pass` does what the test says."""

    instance = "test:1:abcd"
    webhooks = None  # no [webhook] url: no webhook job
    key_file_problem = None
    breaker_retry_at = None  # no breaker open

    def watch_key_file(self) -> None:
        """The key file is as it was."""

    def __init__(self, run_pass: Any) -> None:
        self.run_pass = run_pass
        self.settings = SimpleNamespace(
            poll=SimpleNamespace(tick=timedelta(minutes=1)),
            serve=SimpleNamespace(
                grace_period=timedelta(seconds=10),
                heartbeat=timedelta(seconds=30),
                maintenance_interval=timedelta(hours=1),
            ),
        )
        self.stop_requests: list[float] = []
        self.stopped = anyio.Event()

    def request_stop(self, grace: float) -> None:
        self.stop_requests.append(grace)
        self.stopped.set()


def service(run_pass: Any) -> tuple[Service, StandInWorker, RecordingNotifier]:
    worker, notifier = StandInWorker(run_pass), RecordingNotifier()
    return Service(worker, notifier), worker, notifier  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "name", "exit_code", "traceback"),
    [
        (RuntimeError("a bug"), "RuntimeError", 1, True),
        (ConfigError("broken", key="poll.tick"), "ConfigError", 78, False),
        # The database went away under a reader: the pass's task groups wrap the error.
        (
            ExceptionGroup("pass", [ExceptionGroup("readers", [StorageError("gone")])]),
            "StorageError",
            75,
            False,
        ),
        # Every pooled connection held by a stalled database, then a cut: no bug either.
        (
            ExceptionGroup("pass", [StorageError("gone"), PoolTimeout("QueuePool limit")]),
            "StorageError",
            75,
            False,
        ),
        (OperationalError("SELECT 1", {}, Exception("closed")), "StorageError", 75, False),
        (
            ExceptionGroup("pass", [StorageError("gone"), RuntimeError("a bug")]),
            "ExceptionGroup",
            1,
            True,
        ),
    ],
)
async def test_a_failing_pass_is_an_error_event_and_the_service_goes_on(
    error: Exception, name: str, exit_code: int, traceback: bool
) -> None:
    """A pass that raises is one `error` event (a traceback only for a bug); the service goes on."""

    async def run_pass() -> Any:
        raise error

    svc, _, notifier = service(run_pass)
    with capture_logs() as logs:
        await svc._pass_job()
    (event,) = [e for e in logs if e["event"] == "error"]
    assert (event["job"], event["error"], event["exit_code"]) == ("pass", name, exit_code)
    assert ("exc_info" in event) is traceback
    assert notifier.sent == [("status", "last pass failed; see the log")]
    assert svc.passes == 0
    assert not svc._fatal.is_set() and svc.exit_code != 78
    with anyio.fail_after(1):
        await svc.guard.idle.wait()


async def test_a_stop_lets_the_running_pass_finish() -> None:
    """SIGTERM during a pass pauses the scheduler and returns once the pass has wound down."""
    started, finished = anyio.Event(), anyio.Event()

    async def run_pass() -> Any:
        started.set()
        await worker.stopped.wait()  # a pass that runs until it is asked to stop
        await anyio.sleep(0.05)  # winding down: the last reads, the commit
        finished.set()
        return SimpleNamespace(users=1, reads=2, throttled=0, stopped="cancelled")

    svc, worker, notifier = service(run_pass)
    scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
    scheduler.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(svc._pass_job)
        await started.wait()
        with anyio.fail_after(5):
            await svc._stop(scheduler, "SIGTERM")
        assert finished.is_set()
    assert worker.stop_requests == [10.0]
    assert notifier.sent[0] == ("stopping", "stopping on SIGTERM")
    assert notifier.sent[1][1].startswith("pass 1: 1 users, 2 reads, 0 throttled, cancelled")
    await svc._pass_job()  # after a stop no new pass starts
    assert svc.passes == 1


async def test_a_stop_during_the_key_file_check_waits_for_it_and_starts_no_pass() -> None:
    """SIGTERM during a pass job's key file check waits for it; the job starts no pass."""
    checking, go_on = threading.Event(), threading.Event()
    order: list[str] = []

    async def run_pass() -> Any:
        order.append("pass")
        return SimpleNamespace(users=0, reads=0, throttled=0, stopped="cancelled")

    svc, worker, _ = service(run_pass)

    def held_check() -> None:
        checking.set()
        go_on.wait(10)

    worker.watch_key_file = held_check  # type: ignore[method-assign]
    scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=UTC)
    scheduler.start()

    async def job() -> None:
        await svc._pass_job()
        order.append("job")

    async def stop() -> None:
        await svc._stop(scheduler, "SIGTERM")
        order.append("stop")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(job)
            assert await anyio.to_thread.run_sync(checking.wait, 10)
            tg.start_soon(stop)
            await worker.stopped.wait()  # the stop has begun
            go_on.set()
    assert order == ["job", "stop"]
