"""Users' rows as the driver gives them, turned into `UserRow` records cheaply.

A claim returns a batch of users (a thousand on a big database); SQLAlchemy's result
processing of the JSON and datetime columns, then a second pass to build the records, cost
twenty times the SQL. Here those columns come through untouched (`type_coerce` to
`NullType`) and one function converts a row: JSON text is parsed (the scopes, always one
of a few lists, once per distinct text; PostgreSQL's JSON is selected as text for that,
`PG_RAW_USER_COLUMNS`) and SQLite's naive UTC text timestamps read with
`datetime.fromisoformat`; PostgreSQL's driver gives timestamps as aware datetimes, which
are put in UTC.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final, cast

from sqlalchemy import ColumnElement, Text, type_coerce
from sqlalchemy import cast as sql_cast
from sqlalchemy.types import NullType

from lta_worker.domain import ChangeEstimate, EncryptedToken, UserRow
from lta_worker.storage._models import User

_USERS: Final = User.__table__
_RAW: Final = frozenset(
    {"scopes", "denied", "enrolled_at", "last_polled_at", "next_due_at", "estimate"}
)
_NAMES: Final = (
    "id",
    "user",
    "state",
    "token_ciphertext",
    "token_key_id",
    "scopes",
    "denied",
    "enrolled_at",
    "last_polled_at",
    "next_due_at",
    "consecutive_failures",
    "last_outcome",
    "last_code",
    "generation",
    "estimate",
)
_JSON: Final = frozenset({"scopes", "denied", "estimate"})


def _raw(name: str, json_as_text: bool) -> ColumnElement[Any]:
    column = _USERS.c[name]
    if name not in _RAW:
        return column
    if json_as_text and name in _JSON:
        return type_coerce(sql_cast(column, Text), NullType()).label(name)
    return type_coerce(column, NullType()).label(name)


RAW_USER_COLUMNS: Final[tuple[ColumnElement[Any], ...]] = tuple(
    _raw(name, json_as_text=False) for name in _NAMES
)
"""The columns `raw_user_row` takes, in its order."""
PG_RAW_USER_COLUMNS: Final[tuple[ColumnElement[Any], ...]] = tuple(
    _raw(name, json_as_text=True) for name in _NAMES
)
"""The same for PostgreSQL, its JSON columns as their text (`json::text`): the driver would
parse each value (two thousand `json.loads` per claim of 1,000, half the claim's CPU in the
client), where `raw_user_row` parses the scopes once per distinct text and takes `{}`
without a call, as it does with SQLite's text."""
_WIDTH: Final = len(RAW_USER_COLUMNS)


_FROM_ISO: Final = datetime.fromisoformat


def _stamp(value: Any) -> datetime | None:
    if value is None:
        return None
    if type(value) is str:
        if value[-6] not in "+-" and value[-1] != "Z":  # naive UTC, as `UtcDateTime` writes
            return _FROM_ISO(value + "+00:00")  # 3x faster than .replace()
        value = _FROM_ISO(value)
    if value.tzinfo is None:
        return cast(datetime, value.replace(tzinfo=UTC))
    return cast(datetime, value.astimezone(UTC))


@lru_cache(maxsize=64)
def _scopes(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))


def _denied(raw: Any) -> dict[str, datetime]:
    if isinstance(raw, str):
        raw = json.loads(raw)
    return {endpoint: cast(datetime, _stamp(str(value))) for endpoint, value in raw.items()}


def _estimate(raw: Any) -> ChangeEstimate | None:
    """The freshness estimate: JSON text on SQLite, a dict on PostgreSQL."""
    return ChangeEstimate.from_json(json.loads(raw) if isinstance(raw, str) else raw)


def raw_user_row(row: Any, generation: int | None = None) -> UserRow:
    """A row starting with `RAW_USER_COLUMNS` (either backend) as a UserRow.

    `generation`, when given, is the user's instead of the row's (a new lease's). A claim
    converts a thousand rows: the common values (no denial, no estimate, SQLite's text) are
    taken without a call.
    """
    (
        id_,
        user,
        state,
        ciphertext,
        key_id,
        scopes,
        denied,
        enrolled_at,
        last_polled_at,
        next_due_at,
        failures,
        last_outcome,
        last_code,
        stored_generation,
        estimate,
    ) = row[:_WIDTH]
    return UserRow(
        id_,
        user,
        state,
        None if ciphertext is None else EncryptedToken(bytes(ciphertext), key_id),
        _scopes(scopes) if type(scopes) is str else tuple(scopes or ()),
        {} if not denied or denied == "{}" else _denied(denied),
        _stamp(enrolled_at),
        _stamp(last_polled_at),
        _stamp(next_due_at),
        failures,
        last_outcome,
        last_code,
        stored_generation if generation is None else generation,
        None if estimate is None else _estimate(estimate),
    )
