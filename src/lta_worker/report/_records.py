"""The JSON shapes of a user (`users list --format json`) and a result (`results export`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lta_worker.domain import ResultRow, UserForgotten, UserRow


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a `Z`, or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def user_json(row: UserRow) -> dict[str, Any]:
    """One user as `users list --format json` shows it (never the token)."""
    return {
        "user": row.user,
        "state": row.state,
        "has_token": row.token is not None,
        "scopes": list(row.scopes),
        "enrolled_at": iso(row.enrolled_at),
        "last_polled_at": iso(row.last_polled_at),
        "next_due_at": iso(row.next_due_at),
        "consecutive_failures": row.consecutive_failures,
        "last_outcome": row.last_outcome,
        "last_code": row.last_code,
        "denied": {endpoint: iso(when) for endpoint, when in sorted(row.denied.items())},
    }


def result_json(row: ResultRow | UserForgotten) -> dict[str, Any]:
    """One exported result (a line of `results export`), or a forgotten user's feed line."""
    from lta_worker.domain import UserForgotten  # loaded already: the row is one of its

    if isinstance(row, UserForgotten):
        return {"user": row.user, "forgotten": True, "reason": row.reason, "at": iso(row.at)}
    return {
        "user": row.user,
        "endpoint": row.endpoint,
        "status": row.status,
        "payload": row.payload,
        "fetched_at": iso(row.fetched_at),
        "changed_at": iso(row.changed_at),
        "state": row.state,
    }
