"""The payload types of `lta_worker.api`, docs/schemas and the code that makes the bodies agree
(what the sender and the feed send is validated by the e2e webhook and feed CLI tests)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, get_args

import pytest

from lta_worker.api import ActionCode, ResultChangedData, ResultLine, UserEventData
from lta_worker.domain import EVENT_TYPES, USER_STATES, ResultChanged, StateEvent, UserEventType
from lta_worker.domain._events import ACTION_CODES
from support.schemas import line_problems, schema, webhook_problems

AT = datetime(2026, 1, 1, tzinfo=UTC)
HASH = "ab" * 32


@pytest.mark.parametrize("kind", get_args(UserEventType))
def test_every_user_event_matches_the_schema(kind: str) -> None:
    """A body of each `user.*` type, as the code makes it, matches the schema."""
    event = StateEvent(kind, "alice", "active", "revoked", "PermanentAccessRevoked", AT, "stats")  # type: ignore[arg-type]
    assert webhook_problems(event.payload()) == []
    assert event.payload()["data"]["action"] == ACTION_CODES[kind]  # type: ignore[index]


@pytest.mark.parametrize("content", [False, True])
def test_result_changed_matches_the_schema_with_and_without_content(content: bool) -> None:
    """result.changed, thin or with its content, matches the schema; its action is read_result."""
    body = ResultChanged("a", "stats", "ok", HASH, None, AT, {"n": 1}, with_content=content)
    assert webhook_problems(body.payload()) == []
    assert body.payload()["data"]["action"] == "read_result"


def test_the_schemas_refuse_what_they_do_not_describe() -> None:
    """An unknown field, an unknown state or a wrong action fails the schemas (they can fail)."""
    body = StateEvent("user.revoked", "a", "active", "revoked", None, AT).payload()
    assert webhook_problems({**body, "extra": 1})
    assert webhook_problems({**body, "data": {**body["data"], "new_state": "gone"}})
    assert webhook_problems({**body, "data": {**body["data"], "action": "panic"}})
    assert line_problems({"cursor": -1})
    assert line_problems({"user": "a"})


def _properties(node: dict[str, Any]) -> set[str]:
    return set(node["properties"])


def test_types_schemas_and_codes_agree() -> None:
    """The TypedDicts, the schemas, the event types, action codes and states all agree."""
    hook, line = schema("webhook-event"), schema("result-line")
    defs = hook["$defs"]
    assert set(UserEventData.__annotations__) == _properties(
        defs["user_event"]["properties"]["data"]
    )
    assert set(ResultChangedData.__annotations__) == _properties(
        defs["result_changed"]["properties"]["data"]
    )
    assert set(ResultLine.__annotations__) == _properties(line["$defs"]["result"])
    assert set(ACTION_CODES) == set(EVENT_TYPES)
    assert defs["action"]["enum"] == list(get_args(ActionCode))
    assert set(defs["state"]["enum"]) == set(USER_STATES)
    assert defs["user_event"]["properties"]["type"]["enum"] == list(get_args(UserEventType))
