"""What both example applications share, with no web framework in it (docs/python-api.md):
the webhook receiver and the change feed's consumer, each on the application's own SQLite
database with a connection of its own per call, so that a threaded server (Flask's) never
shares one across threads.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from lta_worker.api import CursorError, LtaApi, WebhookEvent

SCHEMA = """
CREATE TABLE IF NOT EXISTS lta_seen (webhook_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS lta_users (user TEXT PRIMARY KEY, state TEXT, action TEXT);
CREATE TABLE IF NOT EXISTS lta_results (
    user TEXT, endpoint TEXT, payload TEXT, read_at TEXT, PRIMARY KEY (user, endpoint));
CREATE TABLE IF NOT EXISTS lta_cursor (id INTEGER PRIMARY KEY CHECK (id = 1), cursor TEXT);
"""


def create_tables(db_path: str) -> None:
    """Create the application's tables (once, at start)."""
    with closing(sqlite3.connect(db_path)) as db:
        db.executescript(SCHEMA)


@contextmanager
def transaction(db_path: str) -> Iterator[sqlite3.Connection]:
    """A connection of this call's own, in one transaction committed at the end."""
    with closing(sqlite3.connect(db_path)) as db, db:
        yield db


def receive(hook: Webhook, db_path: str, body: bytes, headers: Mapping[str, str]) -> int:
    """Handle one POST from lta-worker; return the HTTP status to answer.

    `headers` as the framework gives them: Werkzeug (Flask) title-cases their names, so
    they are looked up in lower case here.
    """
    headers = {name.lower(): value for name, value in headers.items()}
    try:
        event: WebhookEvent = hook.verify(body, headers)  # signature and timestamp
    except WebhookVerificationError:
        return 400  # forged or stale: never acted on (a real one is sent again)
    with transaction(db_path) as db:  # the id is kept only with the work done
        seen = db.execute(
            "INSERT INTO lta_seen (webhook_id) VALUES (?) ON CONFLICT DO NOTHING",
            (headers["webhook-id"],),
        )
        if seen.rowcount:  # 0: a repeat (delivery is at least once)
            handle(db, event)
    return 204  # acknowledged: lta-worker sends this user's next event


def handle(db: sqlite3.Connection, event: WebhookEvent) -> None:
    """The application's own work: here, keep each user's state and what to do about it."""
    if event["type"] == "result.changed":
        return  # thin by default: the content comes with the feed (`follow_feed`)
    data = event["data"]
    if event["type"] == "user.forgotten":  # action `delete_data`: the account is gone
        db.execute("DELETE FROM lta_results WHERE user = ?", (data["user"],))
    db.execute(
        "INSERT INTO lta_users (user, state, action) VALUES (?, ?, ?) "
        "ON CONFLICT (user) DO UPDATE SET state = excluded.state, action = excluded.action",
        (data["user"], data["new_state"], data["action"]),
    )


def follow_feed(lta: LtaApi, db_path: str) -> int:
    """Take the results stored since the last call into the application's database, with
    the cursor in the same transaction (nothing lost, nothing taken twice); how many.
    Run it from the application's scheduler, or when a `result.changed` arrives."""
    with transaction(db_path) as db:
        row = db.execute("SELECT cursor FROM lta_cursor").fetchone()
        try:
            changes = lta.changes(row[0] if row else 0)
        except CursorError:  # not this database's (restored, replaced): start over from 0
            db.execute("DELETE FROM lta_results")
            changes = lta.changes(0)
        taken = 0
        for line in changes.lines:
            if "forgotten" in line:  # the user's data is gone: so is what we kept of it
                db.execute("DELETE FROM lta_results WHERE user = ?", (line["user"],))
                continue
            db.execute(
                "INSERT OR REPLACE INTO lta_results VALUES (?, ?, ?, ?)",
                (line["user"], line["endpoint"], json.dumps(line["payload"]), line["fetched_at"]),
            )
            taken += 1
        db.execute("INSERT OR REPLACE INTO lta_cursor VALUES (1, ?)", (changes.cursor,))
    return taken
