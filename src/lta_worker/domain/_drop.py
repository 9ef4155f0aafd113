"""The two-phase drop as data: what `users drop` / `users forget` do to a user by its state,
what the answer to the DELETE means, and when an unconfirmed drop goes again."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime
from typing import Final, Literal

from lta_worker.domain._backoff import backoff_delay
from lta_worker.domain._model import UserState
from lta_worker.domain._policy import MIN_RETRY, PolicyConfig
from lta_worker.protocol import REVOKED

DropVerdict = Literal["confirmed", "retry", "refused"]

# What `users drop` / `users forget` do to a user, by its state (DESIGN.md: `dropping`).
# `dropping` keeps the token only to send the DELETE; `retry` re-sends it now.
# fmt: off
DROP_START: Final[Mapping[UserState, Literal["dropping", "unchanged"]]] = {
    "active":   "dropping",
    "parked":   "dropping",
    "unlinked": "dropping",
    "rejected": "dropping",
    "dropping": "dropping",   # the DELETE is sent again at once
    "revoked":  "unchanged",  # no token: nothing to drop; no relabel, no retention restart
    "dropped":  "unchanged",
}
# fmt: on


def drop_verdict(status: int | None, code: str | None) -> DropVerdict:
    """What the answer to a DELETE of the token means for a `dropping` user.

    2xx (spec 4.3: always 204) and 401 `PermanentAccessRevoked` confirm. Another 401 is
    refused: a DELETE of an unknown token answers 204, so it says the credential was not
    accepted (likely a wrong client secret) and the grant may be live: the token is kept.
    Anything else (no answer, 5xx, 404, 429...) is retried with backoff.
    """
    if status is not None and 200 <= status < 300:
        return "confirmed"
    if status == 401:
        return "confirmed" if code == REVOKED else "refused"
    return "retry"


def drop_retry_at(failures: int, now: datetime, cfg: PolicyConfig, rng: random.Random) -> datetime:
    """When an unconfirmed drop is sent again: backoff with jitter, capped at `interval`."""
    delay = backoff_delay(failures, base=cfg.backoff_base, cap=cfg.interval, rng=rng)
    return now + min(max(delay, MIN_RETRY), cfg.interval)
