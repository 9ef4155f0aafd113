"""`serve` on PostgreSQL reached through the fault proxy (`bench/faultproxy.py`): what a
SIGHUP does while every database connection is cut."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from bench.faultproxy import FaultProxy
from sqlalchemy import make_url

from lta_worker.storage import Store
from support.pg import PG_SKIP, PgDatabases

from .helpers import NotifySocket, World, stop

pytestmark = pytest.mark.postgres


@pytest.fixture
def cut_world(world: World, pg_databases: PgDatabases | None) -> Iterator[tuple[World, FaultProxy]]:
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
    cut_world: tuple[World, FaultProxy], notify: NotifySocket
) -> None:
    """SIGHUP while every database connection is cut: the reload cannot check the key ids
    in use, logs ok=false with when it tries again, keeps serving, and applies the new
    config (tick 1h -> 0.5 s) once the database is back, with no second SIGHUP."""
    world, proxy = cut_world
    world.enroll(["alice"])
    world.poll = {"tick": "1h"}
    world.write_config()
    proc = world.start_serve(NOTIFY_SOCKET=str(notify.path))
    try:
        notify.wait_for(lambda m: m.get("STATUS", "").startswith("pass 1:"))
        proxy.cut()
        world.poll = {"tick": "0.5s"}
        world.write_config()
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
