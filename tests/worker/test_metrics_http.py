"""The metrics and health server: `/healthz`'s answer (the verdict itself, `assess_health`:
tests/report/test_status.py), a shared status computation, and slow and idle clients or probes
waiting on a hung database never locking out a scrape or a probe; `Admission`, the connection
bookkeeping of both listeners, as a Hypothesis model (the cap holds, a newcomer is refused only
when every kept connection is being answered, room is made from the oldest head)."""

from __future__ import annotations

import io
import json
import select
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.errors import StorageError
from lta_worker.storage import Store
from lta_worker.worker._listen import Admission
from lta_worker.worker._metrics import Metrics
from lta_worker.worker._metrics_http import MetricsServer, SharedHealth, dispatcher
from support.sockets import closed_within


def test_a_flood_of_health_checks_computes_the_status_once() -> None:
    """Sixteen concurrent callers within the freshness window share one computation."""
    calls: list[float] = []

    def slow_status() -> dict[str, Any]:
        calls.append(time.monotonic())
        time.sleep(0.2)
        return {"healthy": True}

    health = SharedHealth(slow_status, fresh_for=5.0)
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(health())) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(calls) == 1
    assert results == [{"healthy": True}] * 16


def test_a_failed_status_is_not_kept() -> None:
    """A status that raised is computed again by the next caller."""
    answers = iter([RuntimeError("database busy"), {"healthy": True}])

    def flaky() -> dict[str, Any]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    health = SharedHealth(flaky, fresh_for=5.0)
    with pytest.raises(RuntimeError):
        health()
    assert health() == {"healthy": True}


def call(app: Any, path: str) -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {"PATH_INFO": path, "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer.update(status=status, headers=dict(headers))

    body = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], body


@pytest.mark.parametrize(
    ("health", "status", "healthy"),
    [
        ({"healthy": True, "problems": []}, "200 OK", True),
        ({"healthy": False, "problems": ["x"]}, "503 Service Unavailable", False),
        (StorageError("the database refused"), "503 Service Unavailable", False),
    ],
)
def test_healthz_answers(health: Any, status: str, healthy: bool) -> None:
    """200 when healthy, 503 when not or when the status cannot be read; JSON either way."""

    def verdict() -> dict[str, Any]:
        if isinstance(health, Exception):
            raise health
        return {**health, "generated_at": "t", "version": "v"}

    got, headers, body = call(dispatcher(Metrics(), verdict), "/healthz")
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["healthy"] is healthy


def test_other_paths_are_404() -> None:
    """Only /metrics and /healthz answer."""
    got, _, _ = call(dispatcher(Metrics(), dict), "/")
    assert got.startswith("404")


def _server(*, cap: int, deadline: float) -> MetricsServer:
    return MetricsServer(
        "127.0.0.1",
        0,
        Metrics(),
        lambda: {"healthy": True, "problems": [], "generated_at": "now", "version": "test"},
        max_connections=cap,
        head_deadline=deadline,
    )


def test_an_idle_client_is_let_go() -> None:
    """A connection that sends nothing is closed after the head deadline (slowloris)."""
    server = _server(cap=4, deadline=0.5)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as idle:
            assert closed_within(idle, 5.0)
    finally:
        server.close()


def test_past_the_cap_the_oldest_incomplete_connection_makes_room() -> None:
    """Past the cap a newcomer closes the oldest connection still sending its head."""
    server = _server(cap=2, deadline=60.0)
    try:
        oldest = socket.create_connection(("127.0.0.1", server.port))
        younger = socket.create_connection(("127.0.0.1", server.port))
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            assert closed_within(oldest, 5.0)
            extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert _read_all(extra).startswith(b"HTTP/1.0 200 ")
        assert not closed_within(younger, 0.2)
        oldest.close()
        younger.close()
    finally:
        server.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10.0)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


class _Drippers:
    """Slow clients dripping one header per `drip()`, never ending their heads; reconnect if cut."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.socks = [self._connect() for _ in range(count)]
        self.cut = 0  # connections the server closed
        self.sent = 0  # header lines dripped

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        return sock

    def drip(self) -> None:
        for n, sock in enumerate(self.socks):
            try:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable and sock.recv(1) == b"":
                    raise ConnectionResetError
                sock.sendall(b"X-Slow: 1\r\n")
                self.sent += 1
            except OSError:
                self.cut += 1
                sock.close()
                self.socks[n] = self._connect()

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def test_slow_clients_never_lock_out_a_scrape_or_a_probe() -> None:
    """40 clients trickling their heads at a cap of 32: every scrape and probe is answered."""
    server = _server(cap=32, deadline=60.0)
    drippers = _Drippers(server.port, 40)
    try:
        for _ in range(10):
            drippers.drip()
            for path in ("/metrics", "/healthz"):
                url = f"http://127.0.0.1:{server.port}{path}"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    assert answer.status == 200
        assert drippers.cut > 0  # they were there, and made room
    finally:
        drippers.close()
        server.close()


def test_a_client_trickling_its_head_is_cut_at_the_head_deadline() -> None:
    """A client trickling a header every 0.1 s is cut at the head deadline (1 s)."""
    server = _server(cap=4, deadline=1.0)
    drippers = _Drippers(server.port, 1)
    try:
        started = time.monotonic()
        while drippers.cut == 0 and drippers.sent < 100:
            drippers.drip()
            time.sleep(0.1)  # the pace of the trickle, not a wait for the server
        assert drippers.cut == 1
        assert drippers.sent < 50
        assert time.monotonic() - started >= 1.0
    finally:
        drippers.close()
        server.close()


class _Hung:
    """A status that hangs (a stalled database) until `released`."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def __call__(self) -> dict[str, Any]:
        self.released.wait(30)
        return {"healthy": True, "problems": [], "generated_at": "now", "version": "test"}


def test_probes_waiting_on_a_hung_status_never_lock_out_a_scrape() -> None:
    """40 probes waiting on a hung status at a cap of 32: a scrape is still answered."""
    hung = _Hung()
    server = MetricsServer("127.0.0.1", 0, Metrics(), hung)
    probes = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        for probe in probes:
            probe.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        admission = server.server.admission
        while admission.waiting or admission.kept < 16:
            time.sleep(0.01)  # until each probe is answered, waiting, or refused
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
    finally:
        hung.released.set()
        for probe in probes:
            probe.close()
        server.close()


def test_a_locked_database_answers_unhealthy_at_once_after_the_wait(sqlite_store: Store) -> None:
    """A SQLite lock held elsewhere: every probe gets 503 within the wait, not the busy timeout,
    and the status waited for is computed once for them all."""
    path = sqlite_store.database.path
    assert path is not None
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE feed_counter SET value = value")
    calls: list[float] = []

    def status() -> dict[str, Any]:
        calls.append(time.monotonic())
        healthy = sum(sqlite_store.count_by_state().values()) >= 0
        return {"healthy": healthy, "problems": [], "generated_at": "now", "version": "test"}

    server = MetricsServer("127.0.0.1", 0, Metrics(), status, health_wait=0.2)
    try:
        for _ in range(3):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
            assert answer.value.code == 503
            assert "the database does not answer" in answer.value.read().decode()
        assert len(calls) == 1
    finally:
        holder.close()
        server.close()


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["connect", "head", "answered", "expire", "close"]), st.integers(0, 50)
    ),
    max_size=200,
)


@given(cap=st.integers(1, 6), ops=_OPS)
def test_admission_keeps_the_cap_and_makes_room_from_the_oldest_head(
    cap: int, ops: list[tuple[str, int]]
) -> None:
    """The cap holds; room is made only from the oldest connections still sending their heads."""
    admission = Admission(cap, deadline=10.0)
    order: list[int] = []  # connections in the order they came, while they wait
    now = 0.0
    for n, (op, pick) in enumerate(ops):
        now += 1.0
        kept = list(admission.waiting) + list(admission.answering)
        if op == "connect":
            all_answering = len(admission.answering) >= cap
            admitted, evicted = admission.admit(n, now)
            assert admitted is not all_answering
            assert evicted == order[: len(evicted)]
            del order[: len(evicted)]
            if admitted:
                order.append(n)
        elif op == "expire":
            late = admission.expired(now)
            assert late == order[: len(late)]
            del order[: len(late)]
            assert all(deadline > now for deadline in admission.waiting.values())
        elif kept:
            conn = kept[pick % len(kept)]
            if op == "head":
                assert admission.head_done(conn) is (conn in order)
                if conn in order:
                    order.remove(conn)
            elif op == "answered":  # kept open for its next request: the newest waiting one
                if conn in admission.answering:
                    admission.wait_again(conn, now)
                    order.append(conn)
            else:
                admission.release(conn)
                if conn in order:
                    order.remove(conn)
        assert admission.kept == len(admission.waiting) + len(admission.answering) <= cap
        assert list(admission.waiting) == order
