"""docs/examples run in-process as an application runs them against the simulator: enrollment,
webhooks (Werkzeug's title-cased headers and threads for Flask) and the feed consumer."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from lta_worker.api import LtaApi, Settings
from lta_worker.config import build_settings
from lta_worker.domain import StateEvent
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET, Simulator, SimulatorTransport
from lta_worker.storage import Store, generate_key_line
from lta_worker.worker import Worker
from support.enroll import write_private

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SECRET = "whsec_" + base64.b64encode(b"example-webhook-secret-32-bytes!").decode()


def example_settings(tmp: Path, base_url: str, auth_url: str) -> Settings:
    """Settings of a worker whose webhooks go to the example app, its database migrated."""
    data = {
        "service": {"base_url": base_url, "auth_url": auth_url},
        "client": {
            "id": DEMO_CLIENT_ID,
            "secret_file": str(write_private(tmp / "client-secret", DEMO_CLIENT_SECRET)),
            "redirect_uri": "https://app.example/lta/callback",
        },
        "database": {"url": f"sqlite:///{tmp / 'lta.db'}"},
        "crypto": {
            "key_file": str(write_private(tmp / "keys", generate_key_line(datetime.now(UTC))))
        },
        "webhook": {
            "url": "https://app.example/lta/webhook",
            "secret_file": str(write_private(tmp / "webhook-secret", SECRET)),
        },
    }
    settings = build_settings(data)
    with Store.open(settings.database.url) as store:
        store.upgrade()  # `lta-worker db upgrade`: the API never migrates
    return settings


@pytest.fixture
def examples(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/examples importable as the application's modules."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


class ThreadedWsgi(httpx.AsyncBaseTransport):
    """A WSGI app served from worker threads, as a threaded server serves it."""

    def __init__(self, app: Any) -> None:
        self._wsgi = httpx.WSGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        sync = httpx.Request(request.method, request.url, headers=request.headers, content=body)
        answer = await anyio.to_thread.run_sync(self._wsgi.handle_request, sync)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.read())


@contextmanager
def fastapi_driver(settings: Settings, db: str, sim: Simulator) -> Iterator[Any]:
    from fastapi.testclient import TestClient
    from fastapi_app import create_app

    app = create_app(settings, webhook_secret=SECRET, db_path=db, transport=SimulatorTransport(sim))
    with TestClient(app, follow_redirects=False) as client:
        yield client, httpx.ASGITransport(app=app), lambda r: r.json()


@contextmanager
def flask_driver(settings: Settings, db: str, sim: Simulator) -> Iterator[Any]:
    from flask_app import create_app

    app = create_app(settings, webhook_secret=SECRET, db_path=db, transport=SimulatorTransport(sim))
    yield app.test_client(), ThreadedWsgi(app), lambda r: r.get_json()


@pytest.mark.usefixtures("examples")
# FastAPI's TestClient (Starlette's) asks for its httpx fork; httpx serves it as well.
@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
@pytest.mark.parametrize("driver", [fastapi_driver, flask_driver], ids=["fastapi", "flask"])
def test_example_app_enrolls_receives_and_follows_the_feed(
    tmp_path: Path, driver: Callable[..., AbstractContextManager[Any]]
) -> None:
    """The example app enrolls, takes each webhook once, follows the feed and honours a forget."""
    import lta_app

    sim = Simulator()
    sim.configure(budget=100_000, window=3600)  # no pacing wait
    sim.add_user("alice")
    settings = example_settings(tmp_path, "https://api.sim.example", "https://api.sim.example/auth")
    db = str(tmp_path / "app.db")
    with driver(settings, db, sim) as (client, webhook_transport, json_of):
        page = client.get("/lta/enroll", headers={"X-User": "alice"})
        assert page.status_code == 303
        sim.queue_consent("alice")

        async def consent(url: str) -> str:
            async with httpx.AsyncClient(transport=SimulatorTransport(sim)) as http:
                return (await http.get(url)).headers["location"]

        back = anyio.run(consent, page.headers["location"])
        assert back.startswith("https://app.example/lta/callback?code=")
        done = client.get(back.removeprefix("https://app.example"), headers={"X-User": "alice"})
        assert done.status_code == 200, done.text
        assert json_of(done)["user"] == "alice"

        async def one_pass() -> None:
            transport = SimulatorTransport(sim)
            async with Worker(
                settings, transport=transport, webhook_transport=webhook_transport
            ) as worker:
                await worker.run_pass()

        anyio.run(one_pass)
    with sqlite3.connect(db) as app_db:
        users = app_db.execute("SELECT user, state, action FROM lta_users").fetchall()
        seen = app_db.execute("SELECT count(*) FROM lta_seen").fetchone()[0]
    assert users == [("alice", "active", "none")]
    assert seen == 3  # user.enrolled, then result.changed of each endpoint

    async def app_side() -> None:
        async with LtaApi(settings, transport=SimulatorTransport(sim)) as lta:
            assert lta_app.follow_feed(lta, db) == 2
            assert lta_app.follow_feed(lta, db) == 0
            await lta.forget("alice")  # the account deleted on the application's side
            assert lta_app.follow_feed(lta, db) == 0

    anyio.run(app_side)
    with sqlite3.connect(db) as app_db:  # the feed's forget line took what was kept of her
        assert app_db.execute("SELECT count(*) FROM lta_results").fetchone()[0] == 0


@pytest.mark.usefixtures("examples")
def test_the_receiver_acts_once_and_refuses_a_forged_event(tmp_path: Path) -> None:
    """The receiver handles a signed event once however often it comes, and refuses a forged one."""
    import lta_app

    db = str(tmp_path / "app.db")
    lta_app.create_tables(db)
    now = datetime.now(UTC)
    event = StateEvent("user.revoked", "alice", "active", "revoked", None, now)
    body = json.dumps(event.payload())
    headers = {
        "Webhook-Id": "msg_1",
        "Webhook-Timestamp": str(int(now.timestamp())),
        "Webhook-Signature": Webhook(SECRET).sign("msg_1", now, body),
    }
    hook = Webhook(SECRET)
    assert lta_app.receive(hook, db, body.encode(), headers) == 204
    assert lta_app.receive(hook, db, body.encode(), headers) == 204  # again: not redone
    assert lta_app.receive(hook, db, body.encode(), {**headers, "Webhook-Id": "msg_2"}) == 400
    with sqlite3.connect(db) as app_db:
        assert app_db.execute("SELECT * FROM lta_users").fetchall() == [
            ("alice", "revoked", "enroll_again")
        ]
        assert app_db.execute("SELECT count(*) FROM lta_seen").fetchone() == (1,)
