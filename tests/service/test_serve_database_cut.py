"""`serve` on PostgreSQL through the fault proxy (`bench/faultproxy.py`), its connections cut."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest
from bench.faultproxy import FaultProxy
from sqlalchemy import create_engine, make_url, text

from lta_worker.storage import Store
from support.pg import PG_SKIP, PgDatabases
from support.process import NotifySocket, Workspace, free_port, stop
from support.prometheus import http_get as get

pytestmark = pytest.mark.postgres


@pytest.fixture
def cut_world(
    world: Workspace, pg_databases: PgDatabases | None
) -> Iterator[tuple[Workspace, FaultProxy]]:
    """The world's config on a fresh PostgreSQL database reached through a fault proxy."""
    if pg_databases is None:
        pytest.skip(PG_SKIP)
    direct = make_url(pg_databases.create())
    with Store.open(direct.render_as_string(hide_password=False)) as store:
        store.upgrade()
    with FaultProxy((direct.host or "127.0.0.1", direct.port or 5432)) as proxy:
        proxied = direct.set(host="127.0.0.1", port=proxy.port)
        world.database_url = proxied.render_as_string(hide_password=False)
        world.write_config()
        yield world, proxy


def test_a_sighup_during_a_database_cut_is_retried_until_it_applies(
    cut_world: tuple[Workspace, FaultProxy], notify: NotifySocket
) -> None:
    """A SIGHUP during a database cut is retried and applied once the database is back."""
    world, proxy = cut_world
    world.enroll(["alice"])
    world.configure(poll={"tick": "1h"})
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    try:
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        proxy.cut()
        world.configure(poll={"tick": "0.5s"})
        mark = len(notify.messages)
        proc.send_signal(signal.SIGHUP)
        waiting = notify.wait_for(lambda m: m.get("READY") == "1", since=mark)
        assert "waits for the database" in waiting["STATUS"]
        assert proc.poll() is None
        proxy.restore()
        mark = len(notify.messages)
        notify.wait_for(lambda m: m.get("STATUS") == "reloaded", since=mark)
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 2:"), since=mark)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop(proc)
    reloaded = [e for e in world.log_events() if e["event"] == "service.reloaded"]
    assert reloaded[-1]["ok"] is True
    failed = reloaded[:-1]
    assert failed, "the reload during the cut should have failed first"
    assert all(not e["ok"] and e["level"] == "error" and e["retry_in_s"] > 0 for e in failed)
    assert all("database" in e["error"] for e in failed)


def snapshots(url: str) -> set[tuple[object, ...]]:
    """The (user, endpoint) of every stored result, read straight from the database."""
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            return {
                tuple(row) for row in conn.execute(text("SELECT user_id, endpoint FROM snapshots"))
            }
    finally:
        engine.dispose()


def test_a_stalled_database_leaves_health_answering_and_sigterm_obeyed(
    cut_world: tuple[Workspace, FaultProxy], notify: NotifySocket
) -> None:
    """Stalled database: /healthz 503, /metrics answers, SIGTERM ends serve (75), results kept."""
    world, proxy = cut_world
    port = free_port()
    world.extra = f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
    world.configure(poll={"tick": "0.2s", "interval": "0.5s"})
    world.configure(serve={"grace_period": "1s"})
    world.enroll(["ada", "bob"])
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    try:
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        proxy.stall()
        host, pg_port = proxy.target
        direct = make_url(world.database_url or "").set(host=host, port=pg_port)
        stored = snapshots(direct.render_as_string(hide_password=False))
        for _ in range(2):
            status, body = get(f"http://127.0.0.1:{port}/healthz")
            assert status == 503
            assert "the database does not answer" in json.loads(body)["problems"][0]
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)  # the unit's TimeoutStopSec
    finally:
        stop(proc)
        proxy.resume()
    assert code == 75
    assert not [e for e in world.log_events() if e.get("exit_code") == 1]
    assert world.log_events()[-1]["error"] == "StorageError"
    assert stored and stored <= snapshots(direct.render_as_string(hide_password=False))
