"""The webhook event types the docs list are the code's `EVENT_TYPES`, with the code's
`client_action` for each; the example bodies have the fields the code sends."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lta_worker.domain import CLIENT_ACTIONS, EVENT_TYPES, ResultChanged, StateEvent

DOCS = Path(__file__).resolve().parents[2] / "docs"


def events_table(text: str) -> list[tuple[str, str]]:
    """(type, client_action) of each row of webhooks.md's *Events* table."""
    start = text.index("| `type` | the change | `client_action`")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0].strip("`"), cells[2]))
    return rows


def test_events_table_is_the_codes_types_and_actions() -> None:
    """docs/webhooks.md's table: every type in the code's order, with its `client_action`."""
    rows = events_table((DOCS / "webhooks.md").read_text(encoding="utf-8"))
    assert rows == list(CLIENT_ACTIONS.items())
    assert [t for t, _ in rows] == list(EVENT_TYPES)


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


def example_bodies(text: str) -> dict[str, dict[str, Any]]:
    """The JSON bodies webhooks.md shows (in a ```json block, or after a ```http head), by
    their `type`."""
    bodies = {}
    for block in re.findall(r"```(?:json|http)\n(.*?)```", text, re.S):
        body = json.loads(block[block.index("{") :])
        bodies[body["type"]] = body
    return bodies


AT = datetime(2026, 1, 1, tzinfo=UTC)
SHAPES = {
    "result.changed": ResultChanged("alice", "latest-change", "ok", "ab", None, AT).payload(),
    "user.revoked": StateEvent(
        "user.revoked", "alice", "active", "revoked", "PermanentAccessRevoked", AT
    ).payload(),
}


@pytest.mark.parametrize("kind", list(SHAPES))
def test_each_example_body_has_the_shape_the_code_sends(kind: str) -> None:
    """webhooks.md's example bodies carry exactly the fields the code sends, with the
    type's own `client_action`."""
    example = example_bodies((DOCS / "webhooks.md").read_text(encoding="utf-8"))[kind]
    sent = SHAPES[kind]
    assert set(example) == set(sent)
    assert set(example["data"]) == set(sent["data"])
    assert example["data"]["client_action"] == CLIENT_ACTIONS[kind]
