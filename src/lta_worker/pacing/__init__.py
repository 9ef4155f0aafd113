"""Pacing (DESIGN.md, *Pacing*): pure rules under thin async shells (`Pacer`, `SharedBudget`)."""

from __future__ import annotations

from lta_worker.pacing._core import PacerCore, PacerSnapshot
from lta_worker.pacing._pacer import RECHECK, Pacer, PacerLike, Permit, SharedBudget
from lta_worker.pacing._ratelimit import RateLimitInfo
from lta_worker.pacing._window import wait_after_429

__all__ = [
    "RECHECK",
    "Pacer",
    "PacerCore",
    "PacerLike",
    "PacerSnapshot",
    "Permit",
    "RateLimitInfo",
    "SharedBudget",
    "wait_after_429",
]
