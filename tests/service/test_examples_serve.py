"""The Flask example (Werkzeug's threaded server) with a real `serve`: it enrolls, receives
`serve`'s webhooks and follows what `serve` stored."""

from __future__ import annotations

import base64
import signal
import sqlite3
import threading
from pathlib import Path

import httpx
import pytest

from lta_worker.api import LtaApi
from support.process import Workspace, stop, wait_for, write_private

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SECRET = "whsec_" + base64.b64encode(b"flask-example-webhook-secret-32b").decode()


def test_the_flask_example_enrolls_receives_and_follows_a_real_serve(
    world: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Flask example enrolls, gets each webhook once and follows the feed of a real serve."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import lta_app
    from flask_app import create_app
    from werkzeug.serving import make_server

    world.store().close()  # `lta-worker db upgrade`
    db = str(world.tmp / "app.db")
    app = create_app(world.settings(), webhook_secret=SECRET, db_path=db)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    secret_file = write_private(world.tmp / "webhook-secret", SECRET + "\n")
    world.configure(poll={"tick": "200ms"})
    hook = f'url = "{base}/lta/webhook"\nsecret_file = "{secret_file}"\ninterval = "200ms"\n'
    world.extra = f"[webhook]\n{hook}"
    world.write_config()
    proc = None
    try:
        world.sim.add_user("alice")
        world.sim.queue_consent("alice")
        signed_in = {"X-User": "alice"}
        page = httpx.get(f"{base}/lta/enroll", headers=signed_in)
        assert page.status_code == 303
        back = httpx.get(page.headers["location"]).headers["location"]
        query = back.split("?", 1)[1]
        done = httpx.get(f"{base}/lta/callback?{query}", headers=signed_in, timeout=30)
        assert done.status_code == 200, done.text
        proc = world.start_serve()

        def received() -> bool:  # user.enrolled, result.changed of each endpoint
            with sqlite3.connect(db) as app_db:
                return app_db.execute("SELECT count(*) FROM lta_seen").fetchone()[0] == 3

        assert wait_for(received, timeout=30, interval=0.1), world.log_lines()[-5:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc is not None:
            stop(proc)
        server.shutdown()
    with sqlite3.connect(db) as app_db:
        assert app_db.execute("SELECT * FROM lta_users").fetchall() == [("alice", "active", "none")]
    with LtaApi(world.settings()) as lta:
        assert lta_app.follow_feed(lta, db) == 2
