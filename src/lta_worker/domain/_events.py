"""User state changes and new results as webhook events, with what the client should do
(spec section 7). Storage stores them in the outbox in the write's transaction; an event
never carries a token or any other secret. docs/webhooks.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from lta_worker.domain._model import UserState, UserUpdate

# fmt: off
UserEventType = Literal[
    "user.enrolled", "user.rotated", "user.revoked", "user.parked", "user.unlinked",
    "user.rejected", "user.scope_denied", "user.dropping", "user.dropped", "user.forgotten",
    "user.active",
]
EventType = Literal[UserEventType, "result.changed"]
# What `result.changed` carries of the new content: nothing (the event is not written), its
# hashes only (the application reads the row), or the content itself too.
ResultEvents = Literal["off", "hash", "content"]
# The event a change *into* a state is, and what the client should do about it (spec 7).
CLIENT_ACTIONS: Final[Mapping[EventType, str]] = {
    "user.enrolled":     "None; the worker reads the user's data from now on",
    "user.rotated":      "None; the user's new long term token replaced the old one",
    "user.revoked":      "Access is gone and the token deleted; enroll the user again to read",
    "user.parked":       "Keep the token; access resumes by itself when cloud sync is used",
    "user.unlinked":     "Ask the user to link cloud sync in the app",
    "user.rejected":     "Check configuration; not necessarily a revocation",
    "user.scope_denied": "Re-enroll asking for that scope",
    "user.dropping":     "None; the worker finishes the drop with the service",
    "user.dropped":      "None; the client dropped the user's access",
    "user.forgotten":    "Delete what you hold of the user: the worker purged its results",
    "user.active":       "None; access is back",
    "result.changed":    "Read the user's new result (or take it from `content`)",
}
# The same as a code a program can switch on (the event's `action`; docs/webhooks.md).
ActionCode = Literal[
    "none", "enroll_again", "wait", "link_cloud_sync", "check_configuration", "read_result",
    "delete_data",
]
ACTION_CODES: Final[Mapping[EventType, ActionCode]] = {
    "user.enrolled":     "none",
    "user.rotated":      "none",
    "user.revoked":      "enroll_again",
    "user.parked":       "wait",
    "user.unlinked":     "link_cloud_sync",
    "user.rejected":     "check_configuration",
    "user.scope_denied": "enroll_again",
    "user.dropping":     "none",
    "user.dropped":      "none",
    "user.forgotten":    "delete_data",
    "user.active":       "none",
    "result.changed":    "read_result",
}
STATE_EVENTS: Final[Mapping[UserState, EventType]] = {
    "active":   "user.active",
    "parked":   "user.parked",
    "unlinked": "user.unlinked",
    "rejected": "user.rejected",
    "revoked":  "user.revoked",
    "dropping": "user.dropping",
    "dropped":  "user.dropped",
}
# fmt: on
EVENT_TYPES: Final[tuple[EventType, ...]] = tuple(CLIENT_ACTIONS)


@dataclass(frozen=True, slots=True)
class StateEvent:
    """One change of one user, as the webhook receiver gets it."""

    type: EventType
    user: str
    old_state: UserState | None
    new_state: UserState
    reason: str | None
    at: datetime
    endpoint: str | None = None

    def payload(self) -> dict[str, Any]:
        """The JSON body (Standard Webhooks shape: `type`, `timestamp`, `data`)."""
        return {
            "type": self.type,
            "timestamp": self.at.isoformat(),
            "data": {
                "user": self.user,
                "old_state": self.old_state,
                "new_state": self.new_state,
                "reason": self.reason,
                "endpoint": self.endpoint,
                "client_action": CLIENT_ACTIONS[self.type],
                "action": ACTION_CODES[self.type],
            },
        }


@dataclass(frozen=True, slots=True)
class ResultChanged:
    """A read stored content that differs from the stored one (the first result included)."""

    user: str
    endpoint: str
    status: str
    content_hash: str
    previous_hash: str | None
    at: datetime  # the read's `fetched_at`
    content: Any = None
    with_content: bool = False
    type: EventType = "result.changed"

    def payload(self) -> dict[str, Any]:
        """The JSON body (Standard Webhooks shape); `content` only when `with_content`."""
        data: dict[str, Any] = {
            "user": self.user,
            "endpoint": self.endpoint,
            "status": self.status,
            "read_at": self.at.isoformat(),
            "content_hash": self.content_hash,
            "previous_hash": self.previous_hash,
            "client_action": CLIENT_ACTIONS[self.type],
            "action": ACTION_CODES[self.type],
        }
        if self.with_content:
            data["content"] = self.content
        return {"type": self.type, "timestamp": self.at.isoformat(), "data": data}


def change_event(
    user: str, old: UserState | None, new: UserState, at: datetime, reason: str | None = None
) -> StateEvent | None:
    """The event of a state change, or None when the state stayed the same."""
    if old == new:
        return None
    return StateEvent(STATE_EVENTS[new], user, old, new, reason, at)


def forgotten_event(user: str, old: UserState, new: UserState, at: datetime) -> StateEvent:
    """`users forget` purged the user's results (whatever its state, even unchanged)."""
    return StateEvent("user.forgotten", user, old, new, "forget", at)


def turn_events(
    user: str, old: UserState, old_denied: Mapping[str, datetime], upd: UserUpdate, at: datetime
) -> list[StateEvent]:
    """The events of one applied turn: the state change, then each newly denied endpoint."""
    reason = upd.last_code or upd.last_outcome
    events = [e for e in [change_event(user, old, upd.state, at, reason)] if e is not None]
    for endpoint in sorted(set(upd.denied) - set(old_denied)):
        events.append(
            StateEvent("user.scope_denied", user, old, upd.state, "scope_denied", at, endpoint)
        )
    return events


def enrollment_event(user: str, old: UserState | None, had_token: bool, at: datetime) -> StateEvent:
    """A token stored for the user: `user.rotated` when it replaced one, else `user.enrolled`."""
    kind: EventType = "user.rotated" if had_token else "user.enrolled"
    return StateEvent(kind, user, old, "active", "enrollment", at)


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """One queued event as the delivery sends it: the same `event_id` on every attempt."""

    id: int
    event_id: str
    user: str
    type: str
    payload: Mapping[str, Any]
    created_at: datetime
    attempts: int


@dataclass(frozen=True, slots=True)
class OutboxCounts:
    """The webhook outbox at a glance, for `status`."""

    backlog: int = 0
    dead: int = 0
    oldest_at: datetime | None = None
