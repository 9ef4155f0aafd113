"""`serve` delivers webhooks: after its pass, and from its own job for changes another process
made (a `users drop` while it runs), to a receiver on loopback that verifies them with the
`standardwebhooks` library; SIGTERM still exits 0. (Changed results under `serve`:
test_examples_serve.py.)"""

from __future__ import annotations

import base64
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from support.process import Workspace, stop, write_private

SECRET = "whsec_" + base64.b64encode(b"serve-webhook-secret-of-32-bytes").decode()


class Received:
    """What the loopback receiver was sent (each acknowledged with 204)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[dict[str, Any]] = []
        self.ids: set[str] = set()

    def types(self, user: str) -> list[str]:
        """The state event types one user got, in order."""
        with self.lock:
            return [
                b["type"]
                for b in self.bodies
                if b["data"]["user"] == user and b["type"].startswith("user.")
            ]


@pytest.fixture
def receiver() -> Iterator[tuple[Received, int]]:
    """A receiver on a loopback port, shut down after the test."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["content-length"]))
            # What a receiver does: verify, dedup by webhook-id, acknowledge.
            body = Webhook(SECRET).verify(raw, dict(self.headers.items()))
            with received.lock:
                if self.headers["webhook-id"] not in received.ids:
                    received.ids.add(self.headers["webhook-id"])
                    received.bodies.append(body)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    """Poll `predicate` until it holds (the receiver is another thread)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the receiver did not get the events in time"
        time.sleep(0.05)


def test_serve_delivers_after_its_pass_and_from_its_job(
    world: Workspace, receiver: tuple[Received, int]
) -> None:
    """Enrolled and revoked arrive after serve's first pass; dropping and dropped, made by a
    `users drop` while serve runs, arrive through its webhook job; SIGTERM exits 0."""
    received, port = receiver
    secret_file = write_private(world.tmp / "webhook-secret", SECRET + "\n")
    world.configure(poll={"tick": "1h"})
    world.extra = (
        f'[webhook]\nurl = "http://127.0.0.1:{port}/hook"\n'
        f'secret_file = "{secret_file}"\ninterval = "200ms"\n'
    )
    world.write_config()
    world.enroll(["gone", "leaves"])
    world.sim.revoke("gone")
    proc = world.start_serve()
    try:
        wait_until(lambda: received.types("gone") == ["user.enrolled", "user.revoked"])
        drop = world.cli("users", "drop", "--user", "leaves")
        assert drop.returncode == 0, drop.stderr
        wait_until(
            lambda: received.types("leaves") == ["user.enrolled", "user.dropping", "user.dropped"]
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop(proc)
    assert "webhook.delivered" in {e["event"] for e in world.log_events()}
