"""kill -9 between a change and its webhook delivery loses no event: the next `run` delivers
every event the killed one committed, in order per user, under the same webhook-ids."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from lta_worker.simulator import RunningSimulator
from lta_worker.storage import OutboxEvent, Store
from support.process import Workspace, wait_for, write_private

from .crash import deploy

SECRET = "whsec_" + base64.b64encode(b"kill-nine-webhook-secret-32bytes").decode()


@dataclass
class Receiver:
    """A loopback receiver: holds each request unanswered while `holding`, else answers 204."""

    holding: bool = True
    release: threading.Event = field(default_factory=threading.Event)
    held: list[dict[str, Any]] = field(default_factory=list)
    acked: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                event_id = self.headers["webhook-id"]
                with receiver.lock:
                    holding = receiver.holding
                    if holding:
                        receiver.held.append({"id": event_id, **body})
                if holding:
                    receiver.release.wait(60)
                    return  # no answer: the connection closes
                with receiver.lock:
                    receiver.acked.append((event_id, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        return Handler


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    """The receiver on a loopback port; released and shut down after the test."""
    made = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), made.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield made, server.server_address[1]
    finally:
        made.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def deployment(tmp_path: Path, running: RunningSimulator) -> Workspace:
    """Two users enrolled as demo-client."""
    running.sim.reset()
    running.sim.configure(budget=10_000_000, window=3600)
    made = deploy(tmp_path, running)
    made.enroll(["u1", "u2"])
    return made


def queued(deployment: Workspace) -> dict[str, list[str]]:
    """The types of the events in the outbox, per user, in order."""
    with Store.open(deployment.db_url) as store, store.database.read() as conn:
        rows = conn.execute(
            select(OutboxEvent.user, OutboxEvent.type).order_by(OutboxEvent.id)
        ).all()
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r.user, []).append(r.type)
    return out


EXPECTED = {
    "u1": ["user.enrolled", "user.revoked"],
    "u2": ["user.enrolled", "result.changed", "result.changed"],
}


def test_kill9_between_state_change_and_delivery_loses_no_event(
    deployment: Workspace, receiver: tuple[Receiver, int]
) -> None:
    """SIGKILL mid-delivery: the next run delivers every event in order, with the same ids."""
    hook, port = receiver
    secret_file = write_private(deployment.tmp / "webhook-secret", SECRET + "\n")
    deployment.configure(
        webhook={"url": f"http://127.0.0.1:{port}/hook", "secret_file": str(secret_file)}
    )
    deployment.sim.revoke("u1")
    proc = deployment.spawn("run")
    assert wait_for(lambda: hook.held, timeout=60), deployment.keep(proc).stderr[-3000:]
    proc.kill()

    with Store.open(deployment.db_url) as store:
        row = store.get_user("u1")
        assert row is not None
        assert (row.state, row.token) == ("revoked", None)
        assert len(list(store.export_results("u2"))) == 2
    assert queued(deployment) == EXPECTED

    with hook.lock:
        hook.holding = False
    hook.release.set()
    out = deployment.cli("run")
    assert out.returncode == 0, out.stderr[-3000:]
    by_user: dict[str, list[str]] = {}
    for _, body in hook.acked:
        by_user.setdefault(body["data"]["user"], []).append(body["type"])
    assert by_user == EXPECTED
    assert {h["id"] for h in hook.held} <= {event_id for event_id, _ in hook.acked}
    assert queued(deployment) == {}
