"""The soak's TCP proxy (bench/faultproxy.py): forward, cut and restore, stall and resume."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from bench.faultproxy import FaultProxy

WAIT_S = 10.0  # an upper bound for what must happen; the tests never wait it out


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    """A proxy in front of an echo server on loopback."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with FaultProxy(server.server_address[:2]) as running:
            yield running
    finally:
        server.shutdown()
        server.server_close()


def _connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def _echoed(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def _closed(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection (within WAIT_S)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_cut_closes_every_connection_and_refuses_new_ones_until_restored(
    proxy: FaultProxy,
) -> None:
    """cut(): open connections are closed, a new one is closed at once; restore(): all works."""
    first, second = _connect(proxy), _connect(proxy)
    assert _echoed(first, b"a") == b"a" and _echoed(second, b"b") == b"b"  # both ways
    assert proxy.accepted == 2
    proxy.cut()
    assert _closed(first) and _closed(second)
    with _connect(proxy) as refused:
        assert _closed(refused)
    proxy.restore()
    with _connect(proxy) as sock:
        assert _echoed(sock, b"back") == b"back"
    first.close()
    second.close()


def test_a_stall_holds_the_bytes_and_resume_delivers_them(proxy: FaultProxy) -> None:
    """stall(): nothing comes back (the connection stays open); resume(): the held bytes do."""
    with _connect(proxy) as sock:
        assert _echoed(sock, b"before") == b"before"
        proxy.stall()
        sock.sendall(b"held")
        sock.settimeout(0.3)  # absence only: a slow machine makes this pass, never fail
        with pytest.raises(TimeoutError):
            sock.recv(16)
        proxy.resume()
        sock.settimeout(WAIT_S)
        got = b""
        while len(got) < 4:
            got += sock.recv(16)
        assert got == b"held"
