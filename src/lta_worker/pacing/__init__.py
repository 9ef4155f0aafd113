"""Pacing: spend the client's shared hourly budget evenly, never beyond what the service allows.

- `parse_ratelimit`, `RateLimitInfo`: every RateLimit header format, as one plain record;
  `parse_answer`, the same read at the answer's `Date` within `MAX_CLOCK_SKEW` of the local
  clock (`_ratelimit`, pure);
- the window rules, the one home of resets, tolerances, the 429 pause and the clamps that
  keep hostile figures bounded: `bound`, `trusted_wait`, `wait_after_429` and their limits
  (`DEFAULT_MAX_WAIT`, `FALLBACK_429_WAIT`, `MIN_429_WAIT`, `MAX_COUNT`) (`_window`);
- `PacerCore`, the pacer's arithmetic on plain values (`_core`), and `Pacer`, its async
  shell (`_pacer`), with the explicit `Permit` a request is sent with and fed back with,
  and `RECHECK`, the longest it sleeps before looking again; `PacerLike`, what callers
  rely on (`_protocol`);
- `SharedBudget`, the budget row several instances settle into on PostgreSQL, with its pure
  rules (`observation`, `transact`, `Settlement`; `_shared`).
"""

from __future__ import annotations

from lta_worker.pacing._core import PacerCore, PacerSnapshot
from lta_worker.pacing._pacer import RECHECK, Pacer, Permit
from lta_worker.pacing._protocol import PacerLike
from lta_worker.pacing._ratelimit import (
    MAX_CLOCK_SKEW,
    RateLimitInfo,
    parse_answer,
    parse_ratelimit,
)
from lta_worker.pacing._shared import Settlement, SharedBudget, observation, transact
from lta_worker.pacing._window import (
    DEFAULT_MAX_WAIT,
    FALLBACK_429_WAIT,
    MAX_COUNT,
    MIN_429_WAIT,
    bound,
    trusted_wait,
    wait_after_429,
)

__all__ = [
    "DEFAULT_MAX_WAIT",
    "FALLBACK_429_WAIT",
    "MAX_CLOCK_SKEW",
    "MAX_COUNT",
    "MIN_429_WAIT",
    "RECHECK",
    "Pacer",
    "PacerCore",
    "PacerLike",
    "PacerSnapshot",
    "Permit",
    "RateLimitInfo",
    "Settlement",
    "SharedBudget",
    "bound",
    "observation",
    "parse_answer",
    "parse_ratelimit",
    "transact",
    "trusted_wait",
    "wait_after_429",
]
