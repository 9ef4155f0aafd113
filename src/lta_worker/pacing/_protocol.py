"""What callers of the pacer rely on: a typed protocol, so they need not know its class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from lta_worker.pacing._core import PacerSnapshot
from lta_worker.pacing._pacer import Permit


class PacerLike(Protocol):
    """Permits before each request, and every answer fed back (the pass, pending drops)."""

    async def acquire(self) -> Permit:
        """Wait for a permit to send one request; each is handed back to one `feed`."""
        ...

    def feed(
        self,
        permit: Permit | None,
        headers: Mapping[str, str],
        status: int | None,
        *,
        elapsed: float | None = None,
    ) -> None:
        """Learn from an answer's rate limit headers and status (None: no answer came)."""
        ...

    def snapshot(self) -> PacerSnapshot:
        """What the pacer knows of the budget now."""
        ...
