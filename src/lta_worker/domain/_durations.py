"""Durations as operators write them: `90s`, `5m`, `1h`, `1h30m`, `30d`, or plain seconds."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


def parse_duration(value: object) -> timedelta:
    """Parse a timedelta, seconds, or `<unit>` parts (ms s m h d w: `1h30m`); ValueError else."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError("expected a duration such as '30s', '5m', '1h' or '1h30m'")
    elif isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float; not quoted: it may not fit in str()
            raise ValueError("invalid duration: too long to represent") from None
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif _WHOLE.fullmatch(text):
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(
                f"invalid duration {value!r}: expected e.g. '30s', '5m', '1h', '1h30m', '30d'"
            )
    else:
        raise ValueError("expected a duration such as '30s', '5m', '1h' or '1h30m'")
    if seconds < 0 or math.isnan(seconds):
        raise ValueError(f"invalid duration {value!r}: must be finite and not negative")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # beyond timedelta's range, or infinite (`inf`, too many digits)
        raise ValueError(f"invalid duration {value!r}: too long to represent") from None


def format_duration(delta: timedelta) -> str:
    """Render a duration compactly (`1h30m`, `45s`, `0s`) for messages and status output."""
    total = round(delta.total_seconds())
    if total <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
