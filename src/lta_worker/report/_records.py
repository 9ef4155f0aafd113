"""The JSON shapes of the records the commands show: a user (`users list --format json`) and
a result (`results export`), with their times as ISO 8601 in UTC (`iso`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lta_worker.domain import ResultRow, UserRow


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


def result_json(row: ResultRow) -> dict[str, Any]:
    """One exported result (a line of `results export`) as a JSON-ready dict."""
    return {
        "user": row.user,
        "endpoint": row.endpoint,
        "status": row.status,
        "payload": row.payload,
        "fetched_at": iso(row.fetched_at),
        "changed_at": iso(row.changed_at),
        "state": row.state,
    }
