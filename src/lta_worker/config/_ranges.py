"""The one table of allowed ranges for every duration, size and count setting.

A value outside its range stops every command at load with exit 78 naming the key: a `0s`
heartbeat would busy-loop, a `0s` backoff base breaks the backoff arithmetic, an unbounded
`max_response_bytes` lets one answer fill the memory, and a duration of millennia overflows
the first date computed from it. docs/config.md lists the same ranges (a test compares).

The minimums of the loop intervals are small (100 ms) on purpose: the test suites and the
demo run passes many times a second; an operator never needs less.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from lta_worker.domain import format_duration
from lta_worker.errors import ConfigError

if TYPE_CHECKING:
    from lta_worker.config._settings import Settings

Bound = timedelta | int | float

_MS = timedelta(milliseconds=100)
_S = timedelta(seconds=1)
_M = timedelta(minutes=1)
_H = timedelta(hours=1)
_D = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive bounds of a setting."""

    low: Bound
    high: Bound

    def __contains__(self, value: object) -> bool:
        try:
            return bool(self.low <= value <= self.high)  # type: ignore[operator]
        except TypeError:
            return False


RANGES: Final[Mapping[str, Range]] = {
    "service.connect_timeout": Range(_MS, 5 * _M),
    "service.read_timeout": Range(_MS, 10 * _M),
    "service.request_timeout": Range(_S, _H),
    "service.max_response_bytes": Range(1024, 64 * 1024 * 1024),
    "poll.interval": Range(_MS, 365 * _D),
    "poll.parked_interval": Range(_MS, 365 * _D),
    "poll.concurrency": Range(1, 256),
    "poll.max_pass_duration": Range(_MS, _D),
    "poll.batch_size": Range(1, 10_000),
    "poll.tick": Range(_MS, _D),
    "poll.backoff_base": Range(_MS, _D),
    "poll.breaker_threshold": Range(1, 1000),
    "poll.lease_duration": Range(_S, _D),
    "poll.max_interval": Range(_MS, 365 * _D),
    "poll.stats_max_age": Range(_MS, 365 * _D),
    "poll.rate_half_life": Range(_M, 365 * _D),
    "ratelimit.reserve": Range(0.0, 0.95),
    "ratelimit.fallback_per_hour": Range(1.0, 3_600_000.0),
    "ratelimit.max_wait": Range(_S, _D),
    "retention.after_revocation": Range(timedelta(0), 3650 * _D),
    "retention.history": Range(_D, 3650 * _D),
    "webhook.max_age": Range(_M, 30 * _D),
    "webhook.keep_dead": Range(_H, 3650 * _D),
    "webhook.timeout": Range(_S, 5 * _M),
    "webhook.interval": Range(_MS, _H),
    "serve.grace_period": Range(timedelta(0), 15 * _M),
    "serve.heartbeat": Range(_MS, _H),
    "serve.maintenance_interval": Range(_S, 7 * _D),
}


def render(bound: Bound) -> str:
    """A bound as the docs and messages write it (`100ms`, `5m`, `1024`, `0.95`)."""
    if isinstance(bound, timedelta):
        if timedelta(0) < bound < _S:
            return f"{round(bound.total_seconds() * 1000)}ms"
        return format_duration(bound)
    if isinstance(bound, float):
        return str(int(bound)) if bound.is_integer() else f"{bound:g}"
    return str(bound)


def check_ranges(settings: Settings) -> None:
    """Raise ConfigError naming the first setting outside its range."""
    for key, allowed in RANGES.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(settings, section, None), name, None)
        if value is None or value in allowed:
            continue
        shown = render(value) if isinstance(value, timedelta | int | float) else repr(value)
        raise ConfigError(
            f"must be between {render(allowed.low)} and {render(allowed.high)} (got {shown})",
            key=key,
        )
