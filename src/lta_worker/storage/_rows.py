"""Users' rows as the driver gives them, turned into `UserRow` records cheaply.

SQLAlchemy's processing of a claim's JSON and datetime columns cost twenty times the SQL:
they come through untouched (`NullType`) and `raw_user_row` converts them itself.
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
# PostgreSQL's JSON as text: the driver's own parsing was half a claim's client CPU.
PG_RAW_USER_COLUMNS: Final[tuple[ColumnElement[Any], ...]] = tuple(
    _raw(name, json_as_text=True) for name in _NAMES
)
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
    return ChangeEstimate.from_json(json.loads(raw) if isinstance(raw, str) else raw)


def raw_user_row(row: Any, generation: int | None = None) -> UserRow:
    """A row starting with `RAW_USER_COLUMNS` as a UserRow (`generation`: a new lease's)."""
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
