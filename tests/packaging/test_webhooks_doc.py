"""The webhook event types the docs list are the code's `EVENT_TYPES`, with the code's
`client_action` for each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lta_worker.domain import CLIENT_ACTIONS, EVENT_TYPES

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
