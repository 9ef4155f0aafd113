"""The pacer's async shell: reads the clocks (injected), sleeps, parses headers, and hands
out explicit permits; the arithmetic and its rules are `PacerCore` (`_core`).

Each request goes with a `Permit` from `acquire`, and its answer is fed back with that
permit, so the answer's reset is measured from the moment the permit was granted and a
shared budget settles it against the window it was taken from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import anyio

from lta_worker.domain import BudgetSeen
from lta_worker.logs import get_logger
from lta_worker.pacing._core import PacerCore, PacerSnapshot, WaitReason
from lta_worker.pacing._ratelimit import parse_answer
from lta_worker.pacing._shared import SharedBudget, Tag, observation
from lta_worker.pacing._window import bound

LOG_WAIT_OVER: Final = 1.0
# The longest a waiting request sleeps before it looks at the budget again.
RECHECK: Final = 1.0

log = get_logger("lta_worker.pacer")


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to send one request, handed back to `Pacer.feed` with its answer.

    Attributes:
        sent_at: When it was granted, monotonic seconds (an answer's reset was measured
            after it).
        tag: What it counts against in a shared budget, or None without one.
    """

    sent_at: float
    tag: Tag | None = None


class Pacer:
    """The async shell around `PacerCore`: reads the clock, parses headers, sleeps.

    Args:
        core: The arithmetic.
        clock: Monotonic seconds (e.g. `time.monotonic`).
        sleep: Sleeps that many seconds (e.g. `anyio.sleep`); tests advance a fake clock.
        wall_clock: The wall time, to read epoch resets and HTTP-dates when an answer has no
            `Date` header (injected, like the monotonic clock).
        shared: The budget shared with other instances (PostgreSQL): a permit the core
            allows also needs one from it, and every answer is settled with it.
    """

    def __init__(
        self,
        core: PacerCore,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        *,
        wall_clock: Callable[[], datetime],
        shared: SharedBudget | None = None,
    ) -> None:
        self.core = core
        self.shared = shared
        self._clock = clock
        self._sleep = sleep
        self._wall = wall_clock
        # Taken without a checkpoint when free: a permit that needs no wait costs no trip
        # through the event loop.
        self._lock = anyio.Lock(fast_acquire=True)
        self._fed: anyio.Event | None = None  # set by `feed` to wake a waiting acquire

    def set_share(self, share: float) -> None:
        """Set this instance's share of the allowance (1 / number of live instances)."""
        self.core.share = share

    async def acquire(self) -> Permit:
        """Wait until one request may be sent, account it and return its permit.

        Waiters queue one behind the other; the first re-reads the budget whenever an
        answer is fed and at least every `RECHECK` seconds, so a 429 or a fresh header seen
        meanwhile applies to it at once and no permit is ever committed on stale figures.
        Each permit must be handed back to one `feed` (the answer, or status None for a
        failed request).
        """
        async with self._lock:
            logged = False
            began: float | None = None
            while True:
                now = self._clock()
                delay, reason = self.core.delay(now)
                if delay <= 0 and self.shared is not None:
                    shared_wait = await self.shared.ready()
                    now = self._clock()
                    delay, reason = self.core.delay(now)
                    if shared_wait > 0:
                        delay, reason = max(delay, shared_wait), "exhausted"
                if delay <= 0:
                    tag = self.shared.take() if self.shared is not None else None
                    self.core.reserve(now)
                    return Permit(sent_at=now, tag=tag)
                # Logged once it has held a request back a second: a wait that the answer
                # in flight cuts short (the budget it brings) is no wait to report.
                began = now if began is None else began
                if now - began >= LOG_WAIT_OVER and not logged:
                    self._log_wait(now - began + delay, reason)
                    logged = True
                await self._nap(min(delay, RECHECK))

    async def _nap(self, seconds: float) -> None:
        """Sleep `seconds`, or less when an answer is fed meanwhile (it may change the plan)."""
        fed = self._fed = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def sleep() -> None:
                await self._sleep(seconds)
                tg.cancel_scope.cancel()

            async def woken() -> None:
                await fed.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(sleep)
            tg.start_soon(woken)

    def _log_wait(self, delay: float, reason: WaitReason) -> None:
        snap = self.core.snapshot(self._clock())
        log.info(
            "ratelimit.wait",
            wait_s=round(delay, 3),
            remaining=snap.remaining,
            reset_s=None if snap.reset_in is None else round(snap.reset_in, 3),
            reason=reason,
        )

    def feed(
        self,
        permit: Permit | None,
        headers: Mapping[str, str],
        status: int | None,
        *,
        elapsed: float | None = None,
    ) -> None:
        """Learn from one answer's headers and status (status None: no answer came).

        Args:
            permit: The permit the request was sent with, or None for an answer to a
                request the pacer did not grant.
            headers: The answer's headers.
            status: Its HTTP status, or None when the request failed without one.
            elapsed: Seconds the request took. When omitted, the time since the permit
                was granted is used.
        """
        now = self._clock()
        sent_at: float | None = None
        if elapsed is not None:
            sent_at = now - max(0.0, elapsed)
        elif permit is not None:
            sent_at = permit.sent_at
        wall = self._wall()
        max_wait = self.core.max_wait
        info = bound(parse_answer(headers, wall), max_wait)
        self.core.observe(now, info, status, sent_at=sent_at)
        if self._fed is not None:
            self._fed.set()
        if self.shared is not None:
            # Counted from the send, a reported reset is never more than the request's
            # latency early, nor (whole seconds) a second late: see `shared_budget`.
            sent = wall if sent_at is None else wall - timedelta(seconds=max(0.0, now - sent_at))
            seen = observation(info, status, sent, max_wait=max_wait)
            self.shared.settle(None if permit is None else permit.tag, seen)

    def snapshot(self) -> PacerSnapshot:
        """What the pacer knows now."""
        return self.core.snapshot(self._clock())

    def budget_seen(self, now: datetime) -> BudgetSeen | None:
        """The last reported budget as a storage record, or None before any header."""
        snap = self.core.snapshot(self._clock())
        if snap.observed_ago is None:
            return None
        reset_at = None if snap.reset_in is None else now + timedelta(seconds=snap.reset_in)
        return BudgetSeen(
            limit=snap.limit,
            remaining=snap.reported_remaining,
            reset_at=reset_at,
            window_seconds=snap.window,
            observed_at=now - timedelta(seconds=snap.observed_ago),
        )
