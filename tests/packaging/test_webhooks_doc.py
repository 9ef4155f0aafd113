"""The docs' webhook types, actions, example bodies and headers are the code's."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lta_worker import __version__
from lta_worker.config import build_settings
from lta_worker.domain import EVENT_TYPES, PendingEvent, ResultChanged, StateEvent
from lta_worker.domain._events import ACTION_CODES, CLIENT_ACTIONS
from lta_worker.secret import Secret
from lta_worker.upstream import WebhookSender, webhook_http_client
from support.docs import block_after, table

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_events_table_is_the_codes_types_and_actions() -> None:
    """webhooks.md's table lists every type in order with its `client_action` and `action`."""
    text = (DOCS / "webhooks.md").read_text(encoding="utf-8")
    rows = [
        (c[0].strip("`"), c[2], c[3].strip("`"))
        for c in table(text, "| `type` | the change | `client_action`")
    ]
    assert rows == [(t, CLIENT_ACTIONS[t], ACTION_CODES[t]) for t in EVENT_TYPES]


def test_the_receiver_shown_is_the_example_that_runs() -> None:
    """webhooks.md's receiver is, verbatim, the one of docs/examples/lta_app.py (tested)."""
    text = (DOCS / "webhooks.md").read_text(encoding="utf-8")
    block = block_after(text, "python", "## A receiver")
    assert "def receive(" in block
    assert block in (DOCS / "examples" / "lta_app.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("doc", "row"),
    [
        ("config.md", "| `events` | list of event types |"),
        ("log-events.md", "| `webhook.delivered` |"),
    ],
)
def test_every_list_of_types_names_each_type(doc: str, row: str) -> None:
    """A table row that lists the event types names exactly the code's types."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    line = text[text.index(row) :].split("\n", 1)[0]
    listed = set(re.findall(r"`((?:user|result)\.[a-z_]+)`", line))
    assert listed == set(EVENT_TYPES)


def test_examples_are_the_bodies_the_code_sends() -> None:
    """webhooks.md's example bodies and headers are exactly what the code and sender make."""
    text = (DOCS / "webhooks.md").read_text(encoding="utf-8")
    changed = json.loads(block_after(text, "json", "### `result.changed`"))
    data = changed["data"]
    assert (
        ResultChanged(
            user=data["user"],
            endpoint=data["endpoint"],
            status=data["status"],
            content_hash=data["content_hash"],
            previous_hash=data["previous_hash"],
            at=datetime.fromisoformat(data["read_at"]),
        ).payload()
        == changed
    )
    head, _, body = block_after(text, "http", "## The request").partition("\n\n")
    sent = json.loads(body)
    data = sent["data"]
    assert (
        StateEvent(
            type=sent["type"],
            user=data["user"],
            old_state=data["old_state"],
            new_state=data["new_state"],
            reason=data["reason"],
            at=datetime.fromisoformat(sent["timestamp"]),
            endpoint=data["endpoint"],
        ).payload()
        == sent
    )
    headers = dict(line.split(": ", 1) for line in head.splitlines()[1:])
    settings = build_settings(
        {
            "service": {"base_url": "https://api.example", "auth_url": "https://api.example"},
            "client": {"id": "c"},
            "webhook": {"url": "https://app.example/lta/webhook"},
        }
    )
    http = webhook_http_client(settings.webhook)
    assert headers["user-agent"].replace("<version>", __version__) == http.headers["user-agent"]
    secret = Secret("whsec_" + base64.b64encode(bytes(32)).decode())
    event = PendingEvent(
        1, headers["webhook-id"], "alice", sent["type"], sent, datetime.now(UTC), 0
    )
    body, signed = WebhookSender(http, settings.webhook, secret).signed(event, datetime.now(UTC))
    assert json.loads(body) == sent
    assert set(headers) == {"user-agent", *signed}
    assert headers["content-type"] == signed["content-type"]
