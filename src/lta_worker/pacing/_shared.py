"""The shared budget's pure rules (docs/operations.md, *PostgreSQL for several instances*):
the `client_budget` row holds the last figures and, in `reserved`, permits no figure counts
yet. Wall-clock datetimes: monotonic clocks are not shared between hosts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from lta_worker.domain import BudgetSeen
from lta_worker.pacing import _window as window
from lta_worker.pacing._ratelimit import RateLimitInfo

# Permits of a window are granted only until this long before its reported reset.
SPEND_MARGIN: Final = timedelta(seconds=window.SPEND_MARGIN)
# The window is taken as over this long after its reported reset.
RESET_MARGIN: Final = timedelta(seconds=window.RESET_MARGIN)
# How long a refused instance waits before asking again while the row is blind.
BLIND_POLL: Final = 0.25
_EPSILON: Final = 1e-9

Tag = datetime | Literal["blind", "uncounted"]
"""What a permit counts against: a window (its reported reset), a blind probe, or nothing."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """One permit coming back: used (with the answer's figures, if it had any) or unused."""

    tag: Tag
    used: bool = True
    observation: BudgetSeen | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """Permits handed out by one transaction: how many, what they count against (given back
    with each `Settlement`) and, when none, seconds before asking again is worthwhile."""

    granted: int
    tag: Tag
    wait: float = 0.0


def _window(seen: BudgetSeen | None) -> tuple[int, datetime] | None:
    """(remaining, reset_at) of a known window; None with no row, or blind."""
    if seen is None or seen.remaining is None or seen.reset_at is None:
        return None
    return seen.remaining, seen.reset_at


def _tolerance(*seen: BudgetSeen) -> timedelta:
    return timedelta(seconds=window.tolerance(*(s.window_seconds for s in seen)))


def _counted_against_row(seen: BudgetSeen | None, tag: Tag) -> bool:
    """Whether a permit with `tag` is among the row's `reserved`."""
    if seen is None or tag == "uncounted":
        return False
    known = _window(seen)
    if tag == "blind":
        return known is None
    return known is not None and abs(tag - known[1]) < _tolerance(seen)


def settle(
    seen: BudgetSeen | None, reserved: int, back: Settlement, *, now: datetime, reserve: float
) -> tuple[BudgetSeen | None, int]:
    """Apply one permit coming back to the row at `now`: (observation, reserved) after it."""
    obs = back.observation
    figures = _window(obs)
    counted = _counted_against_row(seen, back.tag)
    if obs is None or figures is None:
        if counted and back.tag == "blind" and back.used and seen is not None:
            return _failed_probe(seen, reserved, now=now, reserve=reserve), reserved
        # Unused, it comes back; used without figures, the service may have counted it:
        # it stays reserved until the window ends.
        return seen, max(0, reserved - 1) if counted and not back.used else reserved
    known = _window(seen)
    if seen is None or known is None:
        return _filled(obs, seen), 0
    (remaining, reset_at), (obs_remaining, obs_reset_at) = known, figures
    if abs(obs_reset_at - reset_at) > _tolerance(seen, obs):
        # Resets of two windows: the answer sent later tells the window in force (a new one,
        # or the reset moved earlier with a shorter window; at the same send, the later
        # reset): the old one's permits are over. The other is a late answer.
        if (obs.observed_at, obs_reset_at) > (seen.observed_at, reset_at):
            return _filled(obs, seen), 0
        return seen, reserved
    # The newer figure's limit is in force; a changed limit is followed at once: the local
    # figure of the old limit would hold the budget until the reset (or overspend it).
    newer = obs.observed_at >= seen.observed_at
    changed = newer and None not in (obs.limit, seen.limit) and obs.limit != seen.limit
    merged = BudgetSeen(
        limit=obs.limit if obs.limit is not None and (newer or seen.limit is None) else seen.limit,
        remaining=obs_remaining if changed else min(remaining, obs_remaining),
        reset_at=min(reset_at, obs_reset_at),
        window_seconds=obs.window_seconds or seen.window_seconds,
        observed_at=max(seen.observed_at, obs.observed_at),
    )
    # Its figures count it now (or a later, lower figure does): it leaves `reserved`.
    return merged, max(0, reserved - 1) if counted else reserved


def _probe_cap(seen: BudgetSeen, reserve: float) -> int:
    """Probes that may fail in a row while blind: the usable part of a known limit, else 1."""
    if seen.limit is None:
        return 1
    return max(1, math.floor(seen.limit * (1.0 - reserve) + _EPSILON))


def _failed_probe(seen: BudgetSeen, reserved: int, *, now: datetime, reserve: float) -> BudgetSeen:
    """A blind probe answered without figures: it may have been counted, so it stays in
    `reserved`; the next probe may go at once, or, once as many failed as a window allows,
    after a whole window (a new one has surely begun)."""
    if reserved < _probe_cap(seen, reserve):
        return replace(seen, reset_at=now)
    pause = window.window_length(seen.window_seconds) or window.FALLBACK_429_WAIT
    return replace(seen, reset_at=now + timedelta(seconds=pause))


def _filled(obs: BudgetSeen, previous: BudgetSeen | None) -> BudgetSeen:
    """`obs`, keeping the limit and window length known before when it does not say."""
    if previous is None:
        return obs
    return replace(
        obs,
        limit=obs.limit if obs.limit is not None else previous.limit,
        window_seconds=obs.window_seconds or previous.window_seconds,
    )


def grant(
    seen: BudgetSeen | None,
    reserved: int,
    *,
    now: datetime,
    want: int,
    reserve: float,
    probe_timeout: timedelta,
) -> tuple[BudgetSeen | None, int, Grant]:
    """Hand out up to `want` permits at `now`: (observation, reserved) after it, and the grant."""
    if seen is None:
        return None, reserved, Grant(max(0, want), "uncounted")
    known = _window(seen)
    if known is not None:
        remaining, reset_at = known
        if now < reset_at - SPEND_MARGIN:
            ref = seen.limit if seen.limit is not None else remaining
            allowed = math.floor(remaining - reserve * ref + _EPSILON) - reserved
            granted = max(0, min(want, allowed))
            wait = 0.0 if granted else (reset_at + RESET_MARGIN - now).total_seconds()
            return seen, reserved + granted, Grant(granted, reset_at, wait)
        if now < reset_at + RESET_MARGIN:
            wait = (reset_at + RESET_MARGIN - now).total_seconds()
            return seen, reserved, Grant(0, reset_at, wait)
        seen, reserved = replace(seen, remaining=None, reset_at=None), 0  # the window is over
    # Blind: `reserved` counts the probes of this blind spell (in flight, or failed and
    # maybe counted), `reset_at` is when the next may go (an outstanding probe's deadline).
    deadline = seen.reset_at
    if want > 0 and (deadline is None or now >= deadline):
        if reserved >= _probe_cap(seen, reserve):
            reserved = 0  # a whole window went by since the cap was reached
        return replace(seen, reset_at=now + probe_timeout), reserved + 1, Grant(1, "blind")
    wait = BLIND_POLL  # the probe's answer usually comes at once
    if deadline is not None and reserved >= _probe_cap(seen, reserve):
        wait = max(wait, (deadline - now).total_seconds())  # paused after failed probes
    return seen, reserved, Grant(0, "blind", wait)


def transact(
    seen: BudgetSeen | None,
    reserved: int,
    backs: Sequence[Settlement],
    *,
    now: datetime,
    want: int,
    reserve: float,
    probe_timeout: timedelta,
) -> tuple[BudgetSeen | None, int, Grant]:
    """Settle `backs` in order, then hand out up to `want` permits: one row transaction."""
    for back in backs:
        seen, reserved = settle(seen, reserved, back, now=now, reserve=reserve)
    return grant(seen, reserved, now=now, want=want, reserve=reserve, probe_timeout=probe_timeout)


def observation(
    info: RateLimitInfo | None,
    status: int | None,
    sent_at: datetime,
    *,
    max_wait: float = window.DEFAULT_MAX_WAIT,
) -> BudgetSeen | None:
    """The figures of one answer as an observation, or None: resets count from `sent_at`
    (at most the latency early); a 429 without figures says the window is spent."""
    if status == 429:
        pause = window.pause_after_429(info, max_wait)
        info = window.bound(info, max_wait)
        return BudgetSeen(
            limit=info.limit if info is not None else None,
            remaining=0,
            reset_at=sent_at + timedelta(seconds=pause),
            window_seconds=info.window if info is not None else None,
            observed_at=sent_at,
        )
    info = window.bound(info, max_wait)
    if info is None or info.remaining is None or info.reset_after is None:
        return None
    return BudgetSeen(
        limit=info.limit,
        remaining=info.remaining,
        reset_at=sent_at + timedelta(seconds=max(0.0, info.reset_after)),
        window_seconds=info.window,
        observed_at=sent_at,
    )
