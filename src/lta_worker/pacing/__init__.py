"""Pacing: spend the client's shared hourly budget evenly, never beyond what the service allows.

Pure rules (`_ratelimit` parsing, `_window` limits, `_core` arithmetic, `_shared` budget rows)
under thin async shells (`_pacer`: `Pacer`, `SharedBudget`). DESIGN.md, *Pacing*.
"""

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
