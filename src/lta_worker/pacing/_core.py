"""The pacer's pure core (DESIGN.md, *Pacing*): permits in flight count against the server's
`remaining`; a moved reset or changed limit is followed at once unless the answer is late.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Final, Literal

from lta_worker.config import RateLimitSettings
from lta_worker.pacing._ratelimit import RateLimitInfo
from lta_worker.pacing._window import (
    RESET_MARGIN,
    RESET_TOLERANCE,
    bound,
    longest_wait,
    pause_after_429,
    tolerance,
)

WaitReason = Literal["none", "pacing", "exhausted", "retry_after"]
# A `sent_at` further back than this is not believed (a request never takes that long).
MAX_LATENCY: Final = 300.0
_SLOTS_KEPT: Final = 4096
_EPSILON: Final = 1e-9


@dataclass(frozen=True, slots=True)
class PacerSnapshot:
    """What the pacer knows of the budget, for logs and `status` (`remaining`: the server's
    last figure, `reported_remaining`, less the permits handed out since)."""

    limit: int | None
    remaining: int | None
    reset_in: float | None
    window: float | None
    paused_for: float
    share: float
    reported_remaining: int | None = None
    observed_ago: float | None = None


class PacerCore:
    """The pacer's arithmetic: every method takes `now`. `share`: this instance's share
    (0 < share <= 1); `initial_burst`: permits that go at once before any figure is known."""

    def __init__(
        self,
        ratelimit: RateLimitSettings = RateLimitSettings(),  # noqa: B008 (frozen)
        *,
        share: float = 1.0,
        initial_burst: int = 1,
    ) -> None:
        if initial_burst < 1:
            raise ValueError("initial_burst must be at least 1")
        self.reserve_fraction = ratelimit.reserve
        self.max_wait = ratelimit.max_wait.total_seconds()
        self.fallback_per_hour = ratelimit.fallback_per_hour
        # Enough for the breaker to see a wrong client secret in seconds: plain 401s carry
        # no budget of the client.
        self.initial_burst = initial_burst
        self._unknown_used = 0
        self._share = 1.0
        self.share = share
        self._limit: int | None = None
        self._window: float | None = None
        self._remaining: float | None = None  # effective remaining at the last observation
        # The current window ends between these two (monotonic seconds): permits of the
        # window go before the earliest end, blind ones only after the latest end.
        self._spend_until: float | None = None
        self._reset_at: float | None = None
        self._ref_limit: float = 0.0  # the limit, or the window's highest remaining
        self._since_obs = 0  # permits handed out since that observation
        self._outstanding = 0  # permits handed out whose answer has not been observed
        self._own_in_window = 0  # permits of this instance in the current window
        self._after_reset = 0  # permits handed out past the known window (blind)
        self._last_slot: float | None = None
        self._pause_until = -math.inf
        # Send times of the permits handed out, kept sorted: how many fall after a moment
        # is a bisection, not a scan (this runs on every answer).
        self._slots: list[float] = []
        self._reported: int | None = None
        self._observed_at: float | None = None
        # When the request whose answer set `_limit` was sent: an answer sent earlier that
        # arrives later must not bring back a limit the service has changed since.
        self._limit_sent = -math.inf
        # Likewise for the reset and the window's length in force.
        self._reset_sent = -math.inf

    @property
    def share(self) -> float:
        """This instance's share of the allowance: 1 / number of live instances."""
        return self._share

    @share.setter
    def share(self, value: float) -> None:
        if not 0.0 < value <= 1.0:
            raise ValueError("share must be above 0 and at most 1")
        self._share = value

    def reserve(self, now: float) -> float:
        """Hand out one permit, accounted at once at its slot; seconds to wait before using it."""
        slot, _, in_window = self._plan(now)
        self._hand_out(slot, in_window=in_window)
        return slot - now

    def delay(self, now: float) -> tuple[float, WaitReason]:
        """Seconds until the next permit, and why; nothing accounted (the shell reserves at 0.0)."""
        slot, reason, _ = self._plan(now)
        return slot - now, reason

    def _plan(self, now: float) -> tuple[float, WaitReason, bool]:
        """Where the next permit goes: (slot, why it waits, inside the known window)."""
        start = max(now, self._pause_until)
        paused = self._pause_until > now
        end = self._spend_until
        if end is not None and self._remaining is not None and start < end:
            left = self._left()
            if left >= 1:
                slot = start
                if self._last_slot is not None and self._last_slot < end:
                    # Even spacing: `left` permits and one gap more fit before the end.
                    slot = max(slot, self._last_slot + (end - self._last_slot) / (left + 1))
                if slot < end:
                    return slot, self._reason(slot - now, paused, "pacing"), True
        reset_at = self._reset_at
        # Blind: the known window is spent or over, or none is known yet.
        if reset_at is not None:
            slot = max(start, reset_at + RESET_MARGIN)
            reason: WaitReason = "exhausted" if slot > start else "pacing"
            if self._after_reset > 0 and self._last_slot is not None:
                slot = max(slot, self._last_slot + self._conservative_step())
        else:
            reason = "pacing"
            slot = start
            if self._last_slot is not None and self._unknown_used >= self.initial_burst:
                slot = max(slot, self._last_slot + self._conservative_step())
        return slot, self._reason(slot - now, paused, reason), False

    def paused_for(self, now: float) -> float:
        """Seconds every request is still held after a 429 (0.0 when not paused)."""
        return max(0.0, self._pause_until - now)

    def observe(
        self,
        now: float,
        info: RateLimitInfo | None,
        status: int | None,
        *,
        sent_at: float | None = None,
    ) -> None:
        """Learn from one answer arriving at `now` (once per permit; status None: no answer).

        The server measured the reset between `sent_at` (when known) and `now`: the window
        ends no earlier than `sent_at` plus the reported reset, and no later than `now` plus it.
        """
        info = bound(info, self.max_wait, known_window=self._window)
        # An answer that never came back (a cancelled request) must not count forever.
        recent = self._slots_since(now - MAX_LATENCY)
        self._outstanding = max(0, min(self._outstanding, recent) - 1)
        sent = now if sent_at is None else min(max(sent_at, now - MAX_LATENCY), now)
        limit_changed = False
        if info is not None:
            if info.limit is not None and sent >= self._limit_sent:
                limit_changed = self._limit is not None and info.limit != self._limit
                self._limit, self._limit_sent = info.limit, sent
            if info.window and sent >= self._reset_sent:
                self._window = info.window
        if status == 429:
            self._throttled(now, info)
            self._reset_sent = max(self._reset_sent, sent)
            return
        if info is None or info.remaining is None or info.reset_after is None:
            self._within_window(now)
            return
        if now < self._pause_until:
            return  # an answer that overtook the 429 must not reopen the budget
        self._reported = info.remaining
        self._observed_at = now
        new_reset = now + info.reset_after
        # Whole seconds may have been rounded up: the end can be up to a second earlier.
        rounding = 1.0 if float(info.reset_after).is_integer() else 0.0
        earliest = min(sent + info.reset_after - rounding, new_reset)
        # Resets of two windows: the answer sent later tells the window in force (at the
        # same send, the later reset); the other is a late answer.
        if (
            self._reset_at is not None
            and abs(new_reset - self._reset_at) > tolerance(self._window)
            and (sent, new_reset) < (self._reset_sent, self._reset_at)
        ):
            return
        server = max(0.0, float(info.remaining) - self._outstanding)
        new_window = self._is_new_window(now, sent, earliest, new_reset, info.remaining)
        if new_window:
            self._own_in_window = self._own_since(sent, earliest)
            self._remaining = server
            self._ref_limit = float(info.remaining)
        elif limit_changed:
            # The service changed the quota within the window: its figure is the only one
            # that knows the new limit (a local estimate from the old one would stall the
            # worker until the reset while the reserve is taken from the new limit).
            self._remaining = server
        else:
            assert self._remaining is not None  # a window is known here
            self._remaining = min(server, self._remaining - self._since_obs)
        self._ref_limit = float(self._limit) if self._limit is not None else self._ref_limit
        self._spend_until = earliest
        self._reset_at = new_reset
        self._reset_sent = max(self._reset_sent, sent)
        self._since_obs = 0
        # A window reported spent and already over (its reset past) tells nothing of the
        # next one: blind permits keep the conservative rate, not one probe per such answer.
        if new_window and (info.reset_after > 0 or self._left() >= 1):
            self._after_reset = 0
        self._within_window(now)  # a late answer's reset is never beyond the window in force

    def snapshot(self, now: float) -> PacerSnapshot:
        """What the pacer knows at `now`, for logs and `status`."""
        live = self._reset_at is not None and self._reset_at > now
        remaining = None
        if live and self._remaining is not None:
            remaining = max(0, math.floor(self._remaining - self._since_obs + _EPSILON))
        return PacerSnapshot(
            limit=self._limit,
            remaining=remaining,
            reset_in=(self._reset_at - now) if live and self._reset_at is not None else None,
            window=self._window,
            paused_for=self.paused_for(now),
            share=self._share,
            reported_remaining=self._reported,
            observed_ago=None if self._observed_at is None else max(0.0, now - self._observed_at),
        )

    def _left(self) -> float:
        """Permits still allowed in the current window (fractional)."""
        assert self._remaining is not None
        reserve = self.reserve_fraction * self._ref_limit
        left = max(0.0, self._remaining - reserve) * self._share - self._since_obs
        if self._limit is not None:
            mine = self._limit * (1.0 - self.reserve_fraction) * self._share
            left = min(left, mine - self._own_in_window)
        return math.floor(left + _EPSILON)

    def _hand_out(self, slot: float, *, in_window: bool) -> None:
        if self._reset_at is None and not in_window:
            self._unknown_used += 1
        self._since_obs += 1
        self._outstanding += 1
        if in_window:
            self._own_in_window += 1
        else:
            self._after_reset += 1
        self._last_slot = slot if self._last_slot is None else max(self._last_slot, slot)
        insort(self._slots, slot)
        if len(self._slots) > 2 * _SLOTS_KEPT:  # trimmed in chunks: the oldest go
            del self._slots[:-_SLOTS_KEPT]

    def _conservative_step(self) -> float:
        """Seconds between blind permits: the fallback rate, or the known rate if slower."""
        step = 3600.0 / (self.fallback_per_hour * self._share)
        if self._limit and self._window:
            usable = self._limit * (1.0 - self.reserve_fraction) * self._share
            step = max(step, self._window / usable) if usable > 0 else step
        return step

    def _is_new_window(
        self, now: float, sent: float, earliest: float, new_reset: float, remaining: int
    ) -> bool:
        if self._reset_at is None or self._remaining is None or now >= self._reset_at:
            return True
        # The ends this answer allows miss those of the known window: another window (a late
        # answer of the known one always meets them).
        known_earliest = self._reset_at if self._spend_until is None else self._spend_until
        if sent >= self._reset_sent and (new_reset < known_earliest or earliest > self._reset_at):
            return True
        moved = new_reset - self._reset_at
        if abs(moved) > tolerance(self._window):  # not a late answer: moved by the service
            return True
        grew = remaining > self._remaining - self._since_obs + self._outstanding + 1
        return grew and moved > RESET_TOLERANCE

    def _within_window(self, now: float) -> None:
        """A reset beyond the window's length is not believed: the window ends within it."""
        if self._reset_at is not None:
            latest = now + longest_wait(self._window, self.max_wait)
            self._reset_at = min(self._reset_at, latest)
            if self._spend_until is not None:
                self._spend_until = min(self._spend_until, latest)

    def _own_since(self, sent: float, earliest_end: float) -> int:
        """Permits of this instance already in the window that ends at `earliest_end`."""
        # From the earliest end, the start is early too: a permit near it is counted rather
        # than missed. Without a reported length, count from the request on; the server's
        # remaining (which sees everything) bounds the rest.
        start = earliest_end - self._window if self._window else sent
        return self._slots_since(start)

    def _slots_since(self, start: float) -> int:
        """Permits handed out at or after `start`."""
        return len(self._slots) - bisect_left(self._slots, start)

    def _throttled(self, now: float, info: RateLimitInfo | None) -> None:
        """A 429: hold everything until Retry-After (or the reset); the window is spent."""
        until = now + pause_after_429(info, self.max_wait)
        self._pause_until = max(self._pause_until, until)
        # After the pause, one probe goes out, then the conservative rate until a header.
        self._spend_until = self._reset_at = self._pause_until
        self._remaining = 0.0
        self._since_obs = 0
        self._after_reset = 0

    @staticmethod
    def _reason(delay: float, paused: bool, otherwise: WaitReason) -> WaitReason:
        if delay <= 0:
            return "none"
        return "retry_after" if paused else otherwise
