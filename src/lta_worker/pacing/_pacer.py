"""The pacing's async shells, `Pacer` and `SharedBudget`. Each answer is fed back with its
request's `Permit`, so a reset is measured from the grant and settled against its window.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Final, Protocol, TypeVar

import anyio

from lta_worker.domain import BudgetSeen
from lta_worker.logs import get_logger
from lta_worker.pacing._core import PacerCore, PacerSnapshot, WaitReason
from lta_worker.pacing._ratelimit import parse_answer
from lta_worker.pacing._shared import SPEND_MARGIN, Grant, Settlement, Tag, observation, transact
from lta_worker.pacing._window import bound

LOG_WAIT_OVER: Final = 1.0
# The longest a waiting request sleeps before it looks at the budget again.
RECHECK: Final = 1.0
# A refused instance asks the row again after at most this long (permits given back by
# other instances may have freed some), and no sooner than the grant said.
ASK_AGAIN: Final = timedelta(seconds=2)
R = TypeVar("R")

log = get_logger("lta_worker.pacer")


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to send one request, handed back to `Pacer.feed` with its answer: when it was
    granted (monotonic seconds) and what it counts against in a shared budget, if any."""

    sent_at: float
    tag: Tag | None = None


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


class Pacer:
    """The async shell around `PacerCore`: `clock` monotonic, `wall_clock` for epoch resets
    and answers without `Date`; with `shared`, a permit also needs one from the shared row.
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
        """Wait until one request may be sent and return its permit (for one `feed`); no
        permit is committed on figures older than an answer fed or `RECHECK` seconds."""
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
        """Learn from one answer's headers and status (None: no answer came); `permit` None:
        a request the pacer did not grant; `elapsed` defaults to the time since the permit."""
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
            # Resets count from the send (`observation`): never a latency early, nor a second late.
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
    """Takes permits for this instance from the shared row, `block` at a time at most.

    `ready` then `take` with nothing awaited between (a cancelled wait never loses a
    permit); answers are `settle`d, written by `settle_forever` or the next block.
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
        tag = self._tag
        # Permits of a window whose end is near or past go back: never send them late.
        if self._held and isinstance(tag, datetime) and now >= tag - SPEND_MARGIN:
            self._give_back()
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
