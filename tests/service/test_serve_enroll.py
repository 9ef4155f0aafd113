"""`serve`'s listeners over real sockets: slow and hostile clients, a flood under a low
descriptor limit, an address it cannot bind."""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from lta_worker.errors import EX_CONFIG
from support.process import Workspace, free_port, stop
from support.sockets import closed_within

from .conftest import listen_for_enrollment


def test_the_listener_lets_slow_and_smuggling_clients_go_and_closes_at_sigterm(
    world: Workspace,
) -> None:
    """Idle and slowloris connections are closed at the deadline; Content-Length with chunked
    (smuggling) gets a 400 and a closed connection; the listener closes at SIGTERM. (The
    flow through `serve`: test_browser_enroll.py, in-process: tests/enrollment.)"""
    port = free_port()
    public = listen_for_enrollment(world, port)
    proc = world.start_serve()
    try:
        listening = world.wait_for_event("enroll.listening", proc, timeout=60)
        assert listening["start_url"] == f"{public}/enroll/start"
        idle = socket.create_connection(("127.0.0.1", port))
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"GET /enroll/start HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # a header line now and then, never the end of the head
            time.sleep(2)
            trickle.sendall(b"X-Slow: 1\r\n")
        assert closed_within(idle, 15.0)
        assert closed_within(trickle, 15.0)
        idle.close()
        trickle.close()

        smuggled = b"GET /enroll/start?smuggled=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        head = (
            b"POST /enroll/start HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % len(smuggled)
        )
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(head + smuggled)
            conn.settimeout(15.0)
            received = b""
            while chunk := conn.recv(65536):  # until the listener closes the connection
                received += chunk
        assert received.startswith(b"HTTP/1.1 400 "), received[:80]
        assert received.count(b"HTTP/1.1 ") == 1  # the smuggled GET got no answer
        answer = httpx.get(f"http://127.0.0.1:{port}/enroll/start", timeout=10)
        assert answer.status_code == 400  # no link: the page, served as usual
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def listen_for_metrics(world: Workspace, port: int) -> None:
    world.extra = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    world.write_config()


@pytest.mark.parametrize(
    ("listen", "key"),
    [(listen_for_enrollment, "enroll.listen"), (listen_for_metrics, "metrics.listen")],
    ids=["enroll", "metrics"],
)
def test_an_address_it_cannot_bind_stops_serve_with_78(
    world: Workspace, listen: Callable[[Workspace, int], object], key: str
) -> None:
    """A listen address already taken (the enroll listener's or the metrics port): `serve`
    exits 78 with one error line naming the key, before it serves anything."""
    world.enroll(["ada"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen(world, taken.getsockname()[1])
        assert world.serve_until_exit(timeout=60) == EX_CONFIG
    errors = [e for e in world.log_events() if e["event"] == "error"]
    assert [e["key"] for e in errors] == [key]
    assert not any(e["event"] == "service.started" for e in world.log_events())


def _half_sent(port: int, count: int) -> list[socket.socket]:
    """`count` connections that each send a request line and one header, never the rest
    (connected without blocking: a listener that stops accepting cannot stall the test)."""
    socks = []
    with selectors.DefaultSelector() as selector:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + 10
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1):
                selector.unregister(key.fileobj)
                with contextlib.suppress(OSError):
                    key.fileobj.send(b"GET /enroll/start HTTP/1.1\r\nHost: x\r\n")  # type: ignore[union-attr]
    return socks


def _still_open_after(socks: list[socket.socket], seconds: float) -> int:
    """How many of `socks` the peer has not closed (nor reset) within `seconds`."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                with contextlib.suppress(OSError):
                    if key.fileobj.recv(4096):  # type: ignore[union-attr]
                        continue  # an answer: wait for the close
                selector.unregister(key.fileobj)
        return len(selector.get_map())


def test_a_flood_under_a_low_descriptor_limit_is_quiet_and_served(world: Workspace) -> None:
    """400 stalled connections at RLIMIT_NOFILE 256: requests answered, stderr small JSON."""
    port = free_port()
    listen_for_enrollment(world, port)
    proc = world.start_serve(nofile=256)
    try:
        world.wait_for_event("enroll.listening", proc, timeout=60)
        flood = _half_sent(port, 400)
        try:
            during = httpx.get(f"http://127.0.0.1:{port}/enroll/start", timeout=10)
            assert during.status_code == 400  # no link: the page, served as usual
            assert _still_open_after(flood, 30.0) == 0
        finally:
            for sock in flood:
                sock.close()
        after = httpx.get(f"http://127.0.0.1:{port}/enroll/start", timeout=10)
        assert after.status_code == 400
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)
    assert world.log_file.stat().st_size < 64_000
    world.log_events()  # every line is JSON
