"""The clock, injected: wall time for the database, monotonic time for waiting."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """What the I/O shells read the time from; tests pass a fake one."""

    def now(self) -> datetime:
        """The current wall time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for deadlines and pacing."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """The current wall time, timezone-aware UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()
