"""How a settings section is read from plain TOML (or environment) values: a field's type
says how a value converts, `rule(...)` in its metadata adds its range and checks. (Instead of
pydantic, whose import cost every command about 0.15 s of its start.)
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from lta_worker.domain import format_duration, parse_duration

UNKNOWN = "is not a known setting (check the spelling against the config reference)"
REQUIRED = "is required"
Check = Callable[[Any], Any]
T = TypeVar("T")


Bound = timedelta | int | float


@dataclass(frozen=True, slots=True)
class Rule:
    """The range and checks of one field, beyond its type."""

    low: Bound | None = None
    high: Bound | None = None
    min_length: int | None = None
    before: Check | None = None
    check: Check | None = None


def rule(
    low: Bound | None = None,
    high: Bound | None = None,
    *,
    min_length: int | None = None,
    before: Check | None = None,
    check: Check | None = None,
) -> dict[str, Rule]:
    """A field's metadata: its range (`low` to `high`, both included), length and checks.

    `before` maps the raw value to what the type converts, `check` the typed value to the
    value kept; either refuses a value by raising ValueError (its message is shown).
    """
    return {"rule": Rule(low, high, min_length, before, check)}


_FIELDS: dict[type, tuple[tuple[str, Any, Any, Rule], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, Any, Any, Rule], ...]:
    """(name, type, default or MISSING, rule) of each field of a section class."""
    known = _FIELDS.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = _FIELDS[cls] = tuple(
            (f.name, hints[f.name], f.default, f.metadata.get("rule", Rule()))
            for f in dataclasses.fields(cls)
        )
    return known


def field_types(cls: type) -> dict[str, Any]:
    """Field name -> its type (`None` removed from an optional one), for the docs' tests."""
    out = {}
    for name, kind, _, _ in _fields(cls):
        args = [a for a in get_args(kind) if a is not type(None)]
        optional = get_origin(kind) in (types.UnionType, typing.Union)
        out[name] = args[0] if optional and len(args) == 1 else kind
    return out


def ranges(cls: type, prefix: str = "") -> dict[str, tuple[Bound, Bound]]:
    """`section.key` -> (low, high) of every ranged field of `cls` and its sections."""
    out: dict[str, tuple[Bound, Bound]] = {}
    for name, kind, _, checks in _fields(cls):
        key = f"{prefix}.{name}" if prefix else name
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out.update(ranges(kind, key))
        elif checks.low is not None and checks.high is not None:
            out[key] = (checks.low, checks.high)
    return out


def render(bound: Bound) -> str:
    """A bound or value as the docs and messages write it (`100ms`, `5m`, `1024`, `0.95`)."""
    if isinstance(bound, timedelta):
        if timedelta(0) < bound < timedelta(seconds=1):
            return f"{round(bound.total_seconds() * 1000)}ms"
        return format_duration(bound)
    if isinstance(bound, float):
        return str(int(bound)) if bound.is_integer() else f"{bound:g}"
    return str(bound)


def read_section(
    cls: type[T], data: object, prefix: str, errors: list[tuple[str, str]]
) -> T | None:
    """`cls` built from `data`, or None with the problems appended to `errors` as (key, why)."""
    if not isinstance(data, Mapping):
        errors.append((prefix, "expected a table of settings"))
        return None
    known = _fields(cls)
    values: dict[str, Any] = {}
    before = len(errors)
    for name, kind, default, checks in known:
        key = f"{prefix}.{name}" if prefix else name
        if name not in data:
            if default is dataclasses.MISSING:
                errors.append((key, REQUIRED))
            continue
        try:
            values[name] = _value(kind, data[name], checks, key, errors)
        except _Reported:  # a section's own problems are listed already
            pass
        except ValueError as exc:
            errors.append((key, str(exc)))
    names = [name for name, *_ in known]
    for name in data:
        if name not in names:
            import difflib  # only for a misspelt key: every command's start stays lean

            close = difflib.get_close_matches(str(name), names, n=1)
            meant = f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""
            errors.append((f"{prefix}.{name}" if prefix else str(name), UNKNOWN + meant))
    return cls(**values) if len(errors) == before else None


def _value(kind: Any, raw: Any, checks: Rule, key: str, errors: list[tuple[str, str]]) -> Any:
    if checks.before is not None:
        raw = checks.before(raw)
    value = _convert(kind, raw, key, errors)
    if value is None:
        return None
    _bounds(value, checks)
    return value if checks.check is None else checks.check(value)


def _convert(kind: Any, raw: Any, key: str, errors: list[tuple[str, str]]) -> Any:
    origin = get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        if raw is None:
            return None
        (inner,) = (a for a in get_args(kind) if a is not type(None))
        return _convert(inner, raw, key, errors)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        section = read_section(kind, raw, key, errors)
        if section is None:
            raise _Reported
        return section
    if origin is Literal:
        allowed = get_args(kind)
        if raw not in allowed or not isinstance(raw, str):
            raise ValueError("expected one of " + ", ".join(repr(a) for a in allowed))
        return raw
    if origin is tuple:
        if not isinstance(raw, list | tuple) or not all(isinstance(v, str) for v in raw):
            raise ValueError("expected a list of strings")
        return tuple(raw)
    convert = _SCALARS.get(kind)
    if convert is None:
        raise TypeError(f"no conversion for settings of type {kind!r}")
    return convert(raw)


class _Reported(ValueError):
    """A nested section's own problems are already in the list."""


def _string(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError("expected a string")
    return raw


_INT64 = range(-(2**63), 2**63)  # TOML's integers; beyond, str() of one may even fail


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _BOOLEANS:
        return _BOOLEANS[raw.strip().lower()]
    raise ValueError(f"expected true or false, not {raw!r}")


def _integer(raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw not in _INT64:
            raise ValueError("is too large a number")
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str) and raw.strip().lstrip("+-").isdigit():
        return int(raw.strip())
    raise ValueError(f"expected a whole number, not {raw!r}")


def _number(raw: Any) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        try:
            return float(raw)
        except OverflowError:  # an int beyond any float
            raise ValueError("is too large a number") from None
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, not {raw!r}")


def _path(raw: Any) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ValueError("expected a file path")
    return Path(raw)


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    str: _string,
    bool: _boolean,
    int: _integer,
    float: _number,
    timedelta: parse_duration,
    Path: _path,
}


def _bounds(value: Any, checks: Rule) -> None:
    if checks.min_length is not None and len(value) < checks.min_length:
        raise ValueError("must not be empty" if checks.min_length == 1 else "is too short")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("expected a number, not NaN")
    low, high = checks.low, checks.high
    if low is not None and high is not None and not low <= value <= high:
        raise ValueError(f"must be between {render(low)} and {render(high)} (got {render(value)})")
