"""The simulator's sense of time: the real clock, or a manual one that tests move by hand.

Every time-dependent rule of the service (code and user-token expiry, the 90-day inactivity
threshold, rate-limit windows) reads `Clock.now()` and nothing else, so a test moves time with
`ManualClock.advance` instead of sleeping.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

DEFAULT_START = datetime(2025, 1, 1, tzinfo=UTC)


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime:
        """Return the current time (timezone-aware, UTC)."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> datetime:
        """Return the current wall-clock time in UTC."""
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to; safe to move from another thread.

    Args:
        start: The initial time; naive datetimes are taken as UTC. Defaults to
            2025-01-01T00:00:00Z, the start of an hour, so default windows line up.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = _aware(start or DEFAULT_START)

    def now(self) -> datetime:
        """Return the clock's current time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward (or back, with a negative value) and return the new time."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def set(self, when: datetime) -> datetime:
        """Jump to `when` (naive datetimes are taken as UTC) and return it."""
        with self._lock:
            self._now = _aware(when)
            return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self.now().isoformat()})"


def _aware(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def isoformat(when: datetime) -> str:
    """Render a datetime as ISO 8601 with a `Z` suffix, the way the service's JSON does."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
