"""One client budget shared by the instances on one PostgreSQL database: pure rules, thin shell.

Each instance's pacer (`PacerCore`) spreads its share (1 / live instances) of the allowance
evenly over the window; this module adds the hard limit that all instances keep together.
The `client_budget` row holds what the service last reported (`remaining`, `reset_at`,
`limit`, `window_seconds`, `observed_at`) and, in `reserved`, the permits handed out that no
reported figure accounts for yet. One transaction, with the row locked, settles the answers
that came back and hands out the next small block of permits (`Store.update_budget`).

The rules (`settle` and `grant`, pure; wall-clock datetimes, since monotonic clocks are not
shared between hosts):

- In a known window, permits go while `floor(remaining - reserve * limit) - reserved` is at
  least 1, and only until a second before the reset (`SPEND_MARGIN`). Resets are counted
  from when the request was sent (`observation`): never later than the window's real end
  by a second (whole seconds), nor earlier than it by more than the request's latency.
- An answer with a reset of another window (beyond `tolerance`) opens it when it was sent
  after the row's figures (a new window, or a reset moved earlier: a budget raised with a
  shorter window); sent before them, it is late and changes nothing.
- An answer with figures of the same window lowers `remaining` to the server's (it only
  falls within a window; the earliest reported reset is kept), or sets it to the server's
  when it reports a new limit (the quota raised or lowered: followed at once; an answer
  sent before the figure in the row cannot bring an old limit back), and settles its permit
  (`reserved - 1`): every request counted after the lowest figure was measured is then
  still in `reserved`. An answer without figures (a failure, a plain 401) leaves its permit
  reserved until the window ends, since the service may have counted it. Unused permits
  are given back.
- A second after the reset (`RESET_MARGIN`) the figures are stale: the row goes blind
  (`remaining` NULL, `reserved` 0: permits of the old window, including those a dead
  instance held, are forgotten) and hands out one probe at a time; `reset_at` is then when
  the next probe may go (an unanswered probe is given up after `probe_timeout`). The first
  answer with figures opens the new window. A probe that fails without figures stays
  counted; once as many failed as a window allows, the next goes a whole window later.
- Before any figure was ever reported there is no row: permits are not counted here (each
  pacer's initial burst and fallback rate apply) and the first answer with figures
  creates the row.

Limits: the hosts' clocks must agree to within a second or so; the client's other traffic
is covered only by the reserve, as for one instance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Final, Literal, Protocol, TypeVar

import anyio

from lta_worker.domain import BudgetSeen
from lta_worker.pacing import _window as window
from lta_worker.pacing._ratelimit import RateLimitInfo

# Permits of a window are granted only until this long before its reported reset.
SPEND_MARGIN: Final = timedelta(seconds=window.SPEND_MARGIN)
# The window is taken as over this long after its reported reset.
RESET_MARGIN: Final = timedelta(seconds=window.RESET_MARGIN)
# How long a refused instance waits before asking again while the row is blind.
BLIND_POLL: Final = 0.25
# A refused instance asks the row again after at most this long (permits given back by
# other instances may have freed some), and no sooner than the grant said.
ASK_AGAIN: Final = timedelta(seconds=2)
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
    """Permits handed out by one transaction.

    Attributes:
        granted: How many (0 to the number asked for).
        tag: What they count against; given back with each `Settlement`.
        wait: When none was granted, seconds before asking again is worthwhile.
    """

    granted: int
    tag: Tag
    wait: float = 0.0


# -- the rules ----------------------------------------------------------------------------


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
    seen: BudgetSeen | None,
    reserved: int,
    back: Settlement,
    *,
    now: datetime,
    reserve: float,
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
    """The figures of one answer as an observation, or None when it has none.

    Resets are counted from `sent_at`, when the request left: the service measured them
    later, so the reset is at most the request's latency before the window's real end and
    (rounded up to whole seconds) less than a second after it. A 429 without figures still
    says the window is spent until Retry-After. Every figure is bounded (`window.bound`),
    so nothing reported can overflow a datetime or a column.
    """
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


# -- the shell ----------------------------------------------------------------------------

R = TypeVar("R")


class BudgetStore(Protocol):
    """What the shared budget needs of the store."""

    def update_budget(
        self,
        client_id: str,
        fn: Callable[[BudgetSeen | None, int], tuple[BudgetSeen | None, int, R]],
    ) -> R:
        """Run `fn` on the client's budget row under a lock and write back what it returns."""
        ...


class SharedBudget:
    """Takes permits for this instance from the shared row, a small block at a time.

    The pacer asks `ready` once its own arithmetic lets a permit go, then `take`s it
    (nothing awaits in between, so a cancelled wait never loses a permit), and hands every
    answer to `settle`. Settlements are written by `settle_forever` (run alongside a pass)
    or with the next block; `flush(release=True)` gives the unused block back at a pass's
    end.

    Args:
        store: The store (PostgreSQL).
        client_id: Whose budget.
        reserve: Fraction of the limit left for the client's other traffic.
        clock: The wall time, aware UTC.
        block: Permits taken per transaction at most.
        probe_timeout: How long a blind probe may stay unanswered before another goes.
    """

    def __init__(
        self,
        store: BudgetStore,
        client_id: str,
        *,
        reserve: float,
        clock: Callable[[], datetime],
        block: int = 2,
        probe_timeout: timedelta = timedelta(seconds=60),
    ) -> None:
        if block < 1:
            raise ValueError("block must be at least 1")
        self._store = store
        self._client_id = client_id
        self._reserve = reserve
        self._clock = clock
        self._block_size = block
        self._probe_timeout = probe_timeout
        self._tag: Tag = "uncounted"
        self._held = 0
        self._pending: list[Settlement] = []
        self._wake = anyio.Event()
        self._lock = anyio.Lock()
        self._ask_at: datetime | None = None

    @property
    def held(self) -> int:
        """Permits taken from the row and not used yet."""
        return self._held

    async def ready(self) -> float:
        """0.0 when a permit is at hand (take it at once), else seconds worth waiting."""
        now = self._clock()
        self._drop_stale(now)
        if self._held:
            return 0.0
        if self._ask_at is not None and now < self._ask_at:
            return (self._ask_at - now).total_seconds()
        got = await self._transact(self._block_size)
        if got.granted:
            self._tag, self._held, self._ask_at = got.tag, got.granted, None
            return 0.0
        wait = timedelta(seconds=max(got.wait, 0.0))
        self._ask_at = now + min(wait, ASK_AGAIN)
        return wait.total_seconds()

    def take(self) -> Tag:
        """Use one permit that `ready` made available; returns what it counts against."""
        if self._held < 1:
            raise RuntimeError("take() without a permit: await ready() first")
        self._held -= 1
        return self._tag

    def settle(self, tag: Tag | None, observation: BudgetSeen | None) -> None:
        """An answer came back (or none did) for a permit taken under `tag`."""
        self._pending.append(Settlement(self._tag if tag is None else tag, True, observation))
        self._wake.set()

    async def flush(self, *, release: bool = False) -> None:
        """Write the settlements not written yet; with `release`, give the block back too."""
        if release and self._held:
            self._give_back()
        if self._pending:
            await self._transact(0)

    async def settle_forever(self) -> None:
        """Write settlements as they come, so the others soon see what this one learned."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self.flush()

    def _drop_stale(self, now: datetime) -> None:
        """Give back permits of a window whose end is near or past: never send them late."""
        tag = self._tag
        if self._held and isinstance(tag, datetime) and now >= tag - SPEND_MARGIN:
            self._give_back()

    def _give_back(self) -> None:
        self._pending.extend(Settlement(self._tag, used=False) for _ in range(self._held))
        self._held = 0

    async def _transact(self, want: int) -> Grant:
        async with self._lock:
            backs, self._pending = self._pending, []
            fn = partial(
                transact,
                backs=backs,
                now=self._clock(),
                want=want,
                reserve=self._reserve,
                probe_timeout=self._probe_timeout,
            )
            try:
                return await anyio.to_thread.run_sync(
                    self._store.update_budget, self._client_id, fn
                )
            except BaseException:
                self._pending[:0] = backs  # not written: keep them for the next try
                raise
