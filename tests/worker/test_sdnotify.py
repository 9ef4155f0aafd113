"""systemd's notify protocol as `Notifier` speaks it, against sockets the test binds."""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator

import pytest

from lta_worker.worker._scheduler import Notifier
from support.process import NotifySocket


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
