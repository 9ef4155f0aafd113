"""Parse a response's rate limit fields into one `RateLimitInfo` (DESIGN.md, *Pacing*): the
first format found wins; a malformed field is ignored, never an exception (untrusted input).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from email.utils import parsedate_to_datetime
from functools import partial
from typing import Final

from http_sfv.dictionary import Dictionary
from http_sfv.list import List as SFList

from lta_worker import protocol

# The field names, lower-cased as `_normalise` leaves them.
_RATELIMIT: Final = protocol.RATELIMIT.lower()
_POLICY: Final = protocol.RATELIMIT_POLICY.lower()
_TRIPLE: Final = protocol.RATELIMIT_TRIPLE_PREFIX.lower()
_X_TRIPLE: Final = protocol.X_RATELIMIT_PREFIX.lower()
_RETRY_AFTER: Final = protocol.RETRY_AFTER.lower()
# A reset above this is a Unix time, not a delay (1e9 s is 31 years; 2001-09-09 as a date).
# Only this threshold is used: comparing with `now` would turn every delay into an epoch
# for a clock near 1970, and any real clock is past 1e9 anyway.
EPOCH_THRESHOLD: Final = 1e9
# Above this it is a Unix time in milliseconds.
EPOCH_MS_THRESHOLD: Final = 1e12
# HTTP's optional whitespace is spaces and tabs only (`\s` would take control characters).
_NUMBER = re.compile(r"[ \t]*(\d{1,15})(?:\.(\d{1,9}))?[ \t]*")
# Digits beyond `_NUMBER`'s fifteen: a `Retry-After` that far ahead (see `_retry_after`).
_DIGITS = re.compile(r"[ \t]*\d+[ \t]*")
# A `Date` further than this from the local clock is a broken or hostile clock, not skew
# (AWS SigV4 refuses requests 15 minutes off): it is ignored (see `_answer_time`).
MAX_CLOCK_SKEW: Final = 900.0


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """What one response said about the client's budget (seconds from the `now` given), and
    the format read (`draft-08`, `draft-07`, `triple`, `x-ratelimit`, `retry-after`)."""

    limit: int | None = None
    remaining: int | None = None
    reset_after: float | None = None
    window: float | None = None
    retry_after: float | None = None
    source: str = "none"

    @property
    def wait(self) -> float | None:
        """Seconds to wait before the next request after a refusal: Retry-After, else reset."""
        return self.retry_after if self.retry_after is not None else self.reset_after


def parse_ratelimit(headers: Mapping[str, str], now: datetime | None) -> RateLimitInfo | None:
    """The rate limit fields of a response, or None when none was usable; `now` (when it was
    produced) turns an epoch reset or an HTTP-date `Retry-After` into seconds, else they are
    ignored."""
    return _parse(_normalise(headers), now)


def parse_answer(headers: Mapping[str, str], local_now: datetime | None) -> RateLimitInfo | None:
    """`parse_ratelimit` at the answer's time (`_answer_time`: its `Date` where it can be
    believed, else `local_now`): what the pacer reads from every answer, its headers read once.
    """
    fields = _normalise(headers)
    return _parse(fields, _answer_time(_http_date(fields.get("date")), local_now))


def _answer_time(date: datetime | None, local_now: datetime | None) -> datetime | None:
    """The time an answer's epoch reset and HTTP-date `Retry-After` are measured from."""
    # The earlier of `date` and `local_now`: a `Date` corrects skew only towards waiting
    # longer, and one beyond `MAX_CLOCK_SKEW` cannot stretch waits either.
    if local_now is None:
        return None
    local = _aware(local_now)
    if date is None or abs((date - local).total_seconds()) > MAX_CLOCK_SKEW:
        return local
    return min(date, local)


def _parse(fields: Mapping[str, str], now: datetime | None) -> RateLimitInfo | None:
    now_ts = None if now is None else _aware(now).timestamp()
    retry_after = _retry_after(fields.get(_RETRY_AFTER), now)
    for reader in _READERS:
        found = reader(fields, now_ts)
        if found is not None:
            limit, remaining, reset, window, source = found
            return RateLimitInfo(limit, remaining, reset, window, retry_after, source)
    if retry_after is not None:
        return RateLimitInfo(retry_after=retry_after, source="retry-after")
    return None


_Found = tuple[int | None, int | None, float | None, float | None, str]


def _draft08(fields: Mapping[str, str], now_ts: float | None) -> _Found | None:
    items = _sf_list(fields.get(_RATELIMIT))
    if not items:
        return None
    found = [
        (remaining, _number(params.get("t")), name)
        for name, params in items
        if (remaining := _count(params.get("r"))) is not None
    ]
    if not found:
        return None
    # The most restrictive policy: fewest requests left, then the latest reset.
    remaining, reset_raw, name = min(found, key=lambda f: (f[0], -(f[1] or 0.0)))
    reset = None if reset_raw is None else _reset_seconds(reset_raw, now_ts)
    policies = _sf_list(fields.get(_POLICY)) or []
    named = [p for n, p in policies if n is not None and n == name]
    policy = named[0] if named else (policies[0][1] if len(policies) == 1 else {})
    limit = _count(policy.get("q"))
    window = _number(policy.get("w"))
    return limit, remaining, reset, window, "draft-08"


def _draft07(fields: Mapping[str, str], now_ts: float | None) -> _Found | None:
    raw = fields.get(_RATELIMIT)
    if raw is None:
        return None
    try:
        parsed = Dictionary()
        parsed.parse(raw.encode("ascii"))
    except Exception:
        return None
    values = {key: getattr(member, "value", None) for key, member in parsed.items()}
    limit = _count(values.get("limit"))
    remaining = _count(values.get("remaining"))
    reset_raw = _number(values.get("reset"))
    reset = None if reset_raw is None else _reset_seconds(reset_raw, now_ts)
    if limit is None and remaining is None and reset is None:
        return None
    window = _window_for(_sf_list(fields.get(_POLICY)) or [], limit)
    return limit, remaining, reset, window, "draft-07"


def _separate(
    fields: Mapping[str, str], now_ts: float | None, *, prefix: str, source: str
) -> _Found | None:
    """The separate fields `<prefix>limit`, `-remaining`, `-reset` (`RateLimit-*`, `X-...`)."""
    limit, window = _limit_field(fields.get(prefix + "limit"))
    remaining = _count(_first_number(fields.get(prefix + "remaining")))
    reset_raw = _number(_first_number(fields.get(prefix + "reset")))
    reset = None if reset_raw is None else _reset_seconds(reset_raw, now_ts)
    if reset is None:  # some services send a delay here instead (e.g. Discord)
        reset = _number(_first_number(fields.get(prefix + "reset-after")))
    if limit is None and remaining is None and reset is None:
        return None
    if window is None:
        window = _window_for(_sf_list(fields.get(prefix + "policy")) or [], limit)
    return limit, remaining, reset, window, source


_READERS: Final = (
    _draft08,
    _draft07,
    partial(_separate, prefix=_TRIPLE, source="triple"),
    partial(_separate, prefix=_X_TRIPLE, source="x-ratelimit"),
)


def _limit_field(raw: str | None) -> tuple[int | None, float | None]:
    """`100` or `100, 100;w=3600, 1000;w=86400`: the limit, and the window of its policy."""
    items = _sf_list(raw)
    if not items:
        return _count(_first_number(raw)), None
    limit = _count(items[0][0])
    return limit, _window_for(items[1:] or items, limit)


def _window_for(items: list[tuple[object, dict[str, object]]], limit: int | None) -> float | None:
    """The `w` of the policy whose quota equals the limit, else of the first with a `w`."""
    windows = [(value, _number(params.get("w"))) for value, params in items]
    matching = [w for value, w in windows if w is not None and _count(value) == limit]
    anywhere = [w for _, w in windows if w is not None]
    return next(iter(matching or anywhere), None)


def _retry_after(raw: str | None, now: datetime | None) -> float | None:
    """Seconds to wait from a `Retry-After`: delay-seconds, or an HTTP-date from `now`; more
    than 15 digits are infinite, like a date centuries away, and bounded alike (`bound`)."""
    if raw is None:
        return None
    seconds = _number(_first_number(raw)) if _NUMBER.fullmatch(raw) else None
    if seconds is not None:
        return seconds
    if _DIGITS.fullmatch(raw):
        return math.inf
    when = _http_date(raw)
    if when is None or now is None:
        return None
    return max(0.0, (when - _aware(now)).total_seconds())


def _normalise(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-case names; repeated fields joined with commas (RFC 9110 5.3)."""
    out: dict[str, str] = {}
    try:
        items = list(headers.items())
    except Exception:
        return out
    for name, value in items:
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        key = name.strip().lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def _sf_list(raw: str | None) -> list[tuple[object, dict[str, object]]] | None:
    """Members of a Structured Field List (RFC 8941) as (value, params); None when malformed."""
    if raw is None:
        return None
    try:
        parsed = SFList()
        parsed.parse(raw.encode("ascii"))
    except Exception:
        return None
    return [(getattr(member, "value", None), dict(member.params)) for member in parsed]


def _first_number(raw: str | None) -> object:
    """A plain number, or the first member of a list like `100, 100;w=60`."""
    if raw is None:
        return None
    match = _NUMBER.fullmatch(raw)
    if match:
        whole, fraction = match.group(1), match.group(2)
        return float(f"{whole}.{fraction}") if fraction else int(whole)
    items = _sf_list(raw)
    return items[0][0] if items else None


def _number(value: object) -> float | None:
    """A finite, non-negative number from an SF value; anything else is None."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _count(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _reset_seconds(value: float, now_ts: float | None) -> float | None:
    """Seconds until the reset: `value` itself, or an epoch (seconds or ms) converted."""
    if value >= EPOCH_MS_THRESHOLD:
        value /= 1000.0
    if value < EPOCH_THRESHOLD:
        return value
    if now_ts is None:
        return None
    return max(0.0, value - now_ts)


def _http_date(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return _aware(parsedate_to_datetime(raw))
    except Exception:
        return None


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
