"""The JSON an application receives, as types (docs/schemas/ has them as JSON Schema)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from lta_worker.domain import ActionCode, Endpoint, ResultStatus, UserEventType, UserState


class UserEventData(TypedDict):
    """`data` of a user's state change (`user.*`)."""

    user: str
    old_state: UserState | None
    new_state: UserState
    reason: str | None
    endpoint: Endpoint | None
    client_action: str
    action: ActionCode


class UserEvent(TypedDict):
    """A webhook body of type `user.*`."""

    type: UserEventType
    timestamp: str
    data: UserEventData


class ResultChangedData(TypedDict):
    """`data` of `result.changed`; `content` only with `[webhook] include_content`."""

    user: str
    endpoint: Endpoint
    status: ResultStatus
    read_at: str
    content_hash: str
    previous_hash: str | None
    client_action: str
    action: ActionCode
    content: NotRequired[Any]


class ResultChangedEvent(TypedDict):
    """A webhook body of type `result.changed`."""

    type: Literal["result.changed"]
    timestamp: str
    data: ResultChangedData


WebhookEvent = UserEvent | ResultChangedEvent
"""Any webhook body: narrow on `event["type"] == "result.changed"`."""


class ResultLine(TypedDict):
    """One stored result: a line of `results export` and of the change feed. `fetched_at`
    is when it was read, `changed_at` when this content was first read (ISO 8601, UTC)."""

    user: str
    endpoint: Endpoint
    status: ResultStatus
    payload: Any
    fetched_at: str
    changed_at: str
    state: UserState


class UserForgottenLine(TypedDict):
    """A feed line saying that a user's data is gone (`reason`: `forget` or `retention`, the
    purge of results older than `retention.history`), at `at`: delete what you kept of them."""

    user: str
    forgotten: Literal[True]
    reason: Literal["forget", "retention"]
    at: str


FeedLine = ResultLine | UserForgottenLine
"""A line of the change feed: narrow on `"forgotten" in line`."""


class UserStatus(TypedDict):
    """A user as `users list --format json` shows it: the state, the scopes granted, when
    it was last read and is next due (ISO 8601, UTC), the last outcome; never the token."""

    user: str
    state: UserState
    has_token: bool
    scopes: list[str]
    enrolled_at: str | None
    last_polled_at: str | None
    next_due_at: str | None
    consecutive_failures: int
    last_outcome: str | None
    last_code: str | None
    denied: dict[str, str | None]
