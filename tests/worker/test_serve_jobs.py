"""`serve` in-process: the `Service` jobs with a stand-in worker (a failing job is logged as an
event and the service goes on; a stop waits for the running pass instead of cancelling it), and
systemd's notify protocol as `Notifier` speaks it, against sockets the test binds."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
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
from lta_worker.worker._scheduler import Notifier
from lta_worker.worker._serve import Service
from support.process import NotifySocket

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


def _fields(data: bytes) -> dict[str, str]:
    return {k: v for k, _, v in (line.partition("=") for line in data.decode().splitlines())}


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()


@pytest.fixture
def abstract() -> Iterator[tuple[str, socket.socket]]:
    name = f"lta-test-{secrets.token_hex(6)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    yield "@" + name, sock
    sock.close()


def test_an_abstract_socket_name_starts_with_at(abstract: tuple[str, socket.socket]) -> None:
    """NOTIFY_SOCKET=@name reaches the abstract-namespace socket `\\0name`."""
    address, sock = abstract
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled
    assert notifier.ready("up")
    assert _fields(sock.recv(4096)) == {"READY": "1", "STATUS": "up", "MAINPID": str(os.getpid())}


def test_a_path_socket_gets_each_message_as_one_datagram(notify: NotifySocket) -> None:
    """STATUS, WATCHDOG, RELOADING (with MONOTONIC_USEC) and STOPPING each arrive whole."""
    notifier = Notifier({"NOTIFY_SOCKET": str(notify.path)})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.status("pass 1: 3 users")
    assert notifier.watchdog()
    assert notifier.reloading("reloading")
    assert notifier.stopping("stopping on SIGTERM")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notify.drain()
    assert notify.messages[0] == {"STATUS": "pass 1: 3 users"}
    assert notify.messages[1] == {"WATCHDOG": "1"}
    reloading = notify.messages[2]
    assert (reloading["RELOADING"], reloading["STATUS"]) == ("1", "reloading")
    assert before <= int(reloading["MONOTONIC_USEC"]) <= after
    assert notify.messages[3] == {"STOPPING": "1", "STATUS": "stopping on SIGTERM"}


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}])
def test_without_a_socket_every_call_is_a_no_op(env: dict[str, str]) -> None:
    """Not under systemd: nothing is sent, nothing fails, no watchdog."""
    notifier = Notifier(env)
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    assert not notifier.ready("up")
    assert not notifier.status("x")
    assert not notifier.watchdog()
    assert not notifier.reloading("x")
    assert not notifier.stopping("x")


def test_an_unreachable_socket_is_reported_not_raised() -> None:
    """A NOTIFY_SOCKET nobody listens on makes notify return False; the service goes on."""
    notifier = Notifier({"NOTIFY_SOCKET": "/nonexistent/lta-worker/notify"})
    assert notifier.enabled
    assert not notifier.ready("up")
    assert not Notifier({"NOTIFY_SOCKET": "@lta-nobody-" + secrets.token_hex(6)}).watchdog()


@pytest.mark.parametrize(
    ("usec", "pid", "interval"),
    [
        ("30000000", None, 15.0),  # pings at half WatchdogSec
        ("400000", None, 0.2),
        ("30000000", "self", 15.0),  # WATCHDOG_PID is this process
        ("30000000", "other", None),  # meant for another process (a parent or a child)
        ("0", None, None),
        ("", None, None),
        ("soon", None, None),
        ("-5", None, None),
    ],
)
def test_watchdog_usec_and_pid(usec: str, pid: str | None, interval: float | None) -> None:
    """WATCHDOG_USEC > 0 sets the watchdog at half the period, unless WATCHDOG_PID is another."""
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": usec}
    if pid is not None:
        env["WATCHDOG_PID"] = str(os.getpid() if pid == "self" else os.getpid() + 1)
    assert Notifier(env).watchdog_interval == interval
