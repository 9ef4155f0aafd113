"""The clock, injected from the top, so a pass can run on virtual time."""

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

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """The current wall time, timezone-aware UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """`anyio.sleep` (imported here: `status` reads the clock and never sleeps)."""
        import anyio

        await anyio.sleep(seconds)
