"""Pacing: spend the client's shared hourly budget evenly, never beyond what the service allows.

- `parse_ratelimit`, `RateLimitInfo`, `response_time`, `answer_time`: every RateLimit header
  format, as one plain record, and the time its epochs are read at (`_ratelimit`, pure);
- the window rules, the one home of resets, tolerances, the 429 pause and the clamps that
  keep hostile figures bounded: `bound`, `wait_after_429`, `DEFAULT_MAX_WAIT` (`_window`);
- `PacerCore`, the pacer's arithmetic on plain values (`_core`), and `Pacer`, its async
  shell (`_pacer`), with the explicit `Permit` a request is sent with and fed back with,
  and `RECHECK`, the longest it sleeps before looking again; `PacerLike`, what callers
  rely on (`_protocol`);
- `SharedBudget`, the budget row several instances settle into on PostgreSQL, with its pure
  rules (`_shared`).
"""

from __future__ import annotations

from lta_worker.pacing._core import PacerCore, PacerSnapshot
from lta_worker.pacing._pacer import RECHECK, Pacer, Permit
from lta_worker.pacing._protocol import PacerLike
from lta_worker.pacing._ratelimit import (
    RateLimitInfo,
    answer_time,
    parse_ratelimit,
    response_time,
)
from lta_worker.pacing._shared import SharedBudget
from lta_worker.pacing._window import DEFAULT_MAX_WAIT, bound, wait_after_429

__all__ = [
    "DEFAULT_MAX_WAIT",
    "RECHECK",
    "Pacer",
    "PacerCore",
    "PacerLike",
    "PacerSnapshot",
    "Permit",
    "RateLimitInfo",
    "SharedBudget",
    "answer_time",
    "bound",
    "parse_ratelimit",
    "response_time",
    "wait_after_429",
]
