"""The pacer: its arithmetic against a model server, and the async shell on a fake clock."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from lta_worker.config import RateLimitSettings
from lta_worker.pacing import RECHECK, Pacer, PacerCore, RateLimitInfo


def pacer_core(*, share: float = 1.0, initial_burst: int = 1, **ratelimit: Any) -> PacerCore:
    """A core over `[ratelimit]` with `ratelimit`'s values, the rest its defaults."""
    return PacerCore(RateLimitSettings(**ratelimit), share=share, initial_burst=initial_burst)


# -- a model of the service's budget -----------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One window of the model server: its length, limit, and when other traffic comes."""

    length: float
    limit: int
    others: tuple[float, ...] = ()  # fractions of the window at which other requests arrive
    changes: tuple[tuple[float, int], ...] = ()  # (fraction, new limit) within the window
    # (fraction, new length): the window shortened then (a budget raised); it ends no later.
    cut: tuple[float, float] | None = None

    def end(self) -> float:
        """How long the window really lasts."""
        return self.length if self.cut is None else min(self.length, sum(self.figures(1.0)))

    def figures(self, fraction: float) -> tuple[float, float]:
        """(when the service says the window started, its length) at `fraction` of it."""
        if self.cut is None or fraction < self.cut[0]:
            return 0.0, self.length
        since = self.cut[0] * self.length
        return (since, self.cut[1]) if since + self.cut[1] < self.length else (0.0, self.length)

    def limit_at(self, fraction: float) -> int:
        """The limit in force at `fraction` of the window."""
        limit = self.limit
        for at, new in sorted(self.changes):
            limit = new if at <= fraction else limit
        return limit


@dataclass
class Server:
    """Consecutive fixed windows from t=0; counts every request; answers 200 or 429."""

    windows: Sequence[Window]
    rounding: bool = False  # report whole seconds (rounded up), as headers do
    starts: list[float] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    worker: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    sends: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        start = 0.0
        for window in self.windows:
            self.starts.append(start)
            start += window.end()
        self.end = start
        self.used = [0] * len(self.windows)
        self.worker = [0] * len(self.windows)
        self.refused = [0] * len(self.windows)
        self._others = [sorted(w.others) for w in self.windows]

    def request(self, t: float) -> tuple[int, RateLimitInfo]:
        """One worker request at `t`: count it, answer with the window's figures."""
        i = max(k for k, s in enumerate(self.starts) if s <= t)
        window, start = self.windows[i], self.starts[i]
        while self._others[i] and start + self._others[i][0] * window.length <= t:
            self._others[i].pop(0)
            self.used[i] += 1
        self.worker[i] += 1
        self.sends.append(t)
        limit = window.limit_at((t - start) / window.length)
        allowed = self.used[i] < limit
        self.used[i] += 1 if allowed else 0
        self.refused[i] += 0 if allowed else 1
        since, length = window.figures((t - start) / window.length)
        left = start + since + length - t
        reset = float(math.ceil(left)) if self.rounding else left
        info = RateLimitInfo(
            limit=limit,
            remaining=max(0, limit - self.used[i]),
            reset_after=reset,
            window=length,
            retry_after=None if allowed else reset,
            source="model",
        )
        return (200 if allowed else 429), info


def run(server: Server, cores: Sequence[PacerCore], concurrency: int, latency: float) -> None:
    """Drive each core like `Pacer.acquire` does: waiters queue, the first re-checks."""
    events: list[tuple[float, int, str, tuple[object, ...]]] = []
    queues = [deque(range(concurrency)) for _ in cores]
    counter = 0

    def push(t: float, kind: str, *data: object) -> None:
        nonlocal counter
        heapq.heappush(events, (t, counter, kind, data))
        counter += 1

    for k in range(len(cores)):
        push(0.0, "check", k)
    while events:
        t, _, kind, data = heapq.heappop(events)
        if t >= server.end:
            return
        k = int(data[0])  # type: ignore[call-overload]
        core, queue = cores[k], queues[k]
        if kind == "check":
            if not queue:
                continue
            delay, _ = core.delay(t)
            if delay > 0:
                push(t + min(delay, RECHECK), "check", k)
                continue
            core.reserve(t)
            queue.popleft()
            status, info = server.request(t)
            push(t + latency, "answer", k, status, info, t)
            push(t, "check", k)
        else:
            _, status, info, sent = data
            core.observe(t, info, status, sent_at=sent)  # type: ignore[arg-type]
            queue.append(0)
            if len(queue) == 1:
                push(t, "check", k)


def allowed(window: Window, reserve: float) -> int:
    """What the worker may send in a window: the limit less the reserve."""
    return math.floor(window.limit * (1 - reserve) + 1e-9)


window_strategy = st.builds(
    Window,
    length=st.sampled_from([5.0, 10.0, 60.0, 90.0, 600.0, 3600.0]),
    limit=st.integers(min_value=2, max_value=300),
    others=st.lists(st.floats(min_value=0, max_value=1), max_size=25).map(tuple),
)
changing_window_strategy = st.builds(
    Window,
    length=st.sampled_from([5.0, 60.0, 600.0, 3600.0]),
    limit=st.integers(min_value=2, max_value=300),
    others=st.lists(st.floats(min_value=0, max_value=1), max_size=10).map(tuple),
    changes=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1) | st.just(0.0),
            st.integers(min_value=2, max_value=300),
        ),
        max_size=3,
    ).map(tuple),
    cut=st.none() | st.tuples(st.floats(0, 1), st.sampled_from([1.0, 5.0, 30.0])),
)
reserves = st.sampled_from([0.0, 0.1, 0.25, 0.5])
latencies = st.sampled_from([0.0, 0.05, 0.5, 2.0])
SIM = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the invariant -------------------------------------------------------------------------------


@SIM
@given(
    windows=st.lists(window_strategy, min_size=1, max_size=4),
    reserve=reserves,
    latency=latencies,
    concurrency=st.integers(min_value=1, max_value=8),
    rounding=st.booleans(),
)
def test_never_more_than_allowed_in_any_window(
    windows: list[Window], reserve: float, latency: float, concurrency: int, rounding: bool
) -> None:
    """Whatever the server answers, no window gets more than its limit less the reserve."""
    server = Server(windows, rounding=rounding)
    run(server, [pacer_core(reserve=reserve, fallback_per_hour=60)], concurrency, latency)
    for i, window in enumerate(windows):
        # max(1, ...): a window's first request is a blind probe, sent before its figures
        # can be known; the generated limits always allow at least one anyway.
        assert server.worker[i] <= max(1, allowed(window, reserve)), (i, server.worker)


@SIM
@given(
    windows=st.lists(changing_window_strategy, min_size=1, max_size=4),
    reserve=reserves,
    latency=latencies,
    concurrency=st.integers(min_value=1, max_value=8),
)
# A cut that would end the window later is none: its reset was stated past the real end.
@example([Window(5, 2), Window(5, 19, cut=(0.5, 5.0)), Window(5, 2)], 0.0, 0.5, 3)
# A cut window ended before any answer showed the cut: the permits in flight land blind.
@example([Window(5, 121, cut=(3.8e-227, 1.0)), Window(5, 2)], 0.0, 0.05, 3)
@example([Window(60, 67, cut=(0.75, 1.0)), Window(5, 2)], 0.1, 2.0, 2)
def test_never_more_than_allowed_when_the_limit_changes(
    windows: list[Window], reserve: float, latency: float, concurrency: int
) -> None:
    """With the quota changing within windows, none gets more than its highest allowance."""
    server = Server(windows, rounding=True)
    run(server, [pacer_core(reserve=reserve, fallback_per_hour=60)], concurrency, latency)
    for i, window in enumerate(windows):
        limits = [window.limit, *(new for _, new in window.changes)]
        most = max(allowed(Window(window.length, limit), reserve) for limit in limits)
        # A cut window may end unseen: the permits then in flight land blind in the next one.
        blind = concurrency if i and windows[i - 1].cut else 1
        assert server.worker[i] <= max(blind, most), (i, server.worker)


@SIM
@given(
    windows=st.lists(changing_window_strategy, min_size=1, max_size=4),
    reserve=reserves,
    rounding=st.booleans(),
)
# A window cut, the next one's reset later (or earlier) by less than the tolerance, 1 left of 2.
@example(
    windows=[Window(5, 2), Window(60, 2, cut=(0.25, 1.0)), Window(60, 2)],
    reserve=0.0,
    rounding=False,
)
@example(windows=[Window(3600, 5, cut=(0.75, 1.0)), Window(600, 2)], reserve=0.0, rounding=False)
def test_never_stalls_while_remaining_is_above_the_reserve(
    windows: list[Window], reserve: float, rounding: bool
) -> None:
    """Above the reserve the next permit goes before the reset (rounding: ±1 s at the start)."""
    server = Server(windows, rounding=rounding)
    core = pacer_core(reserve=reserve, fallback_per_hour=60)
    t, sends = 0.0, 0
    while t < server.end and sends < 3000:
        delay, _ = core.delay(t)
        if delay > 0:
            t += min(delay, RECHECK)
            continue
        core.reserve(t)
        sends += 1
        status, answer = server.request(t)
        core.observe(t, answer, status, sent_at=t)
        assert answer.limit is not None and answer.remaining is not None
        assert answer.reset_after is not None
        start = max(s for s in server.starts if s <= t)
        unsure = sum(1 for u in server.sends if start - 1.0 <= u < start)
        spare = answer.remaining - reserve * answer.limit - unsure
        if status == 200 and spare >= 1 and answer.reset_after > 1.0:
            delay, reason = core.delay(t)
            assert reason != "exhausted", (t, answer)
            assert delay < answer.reset_after, (t, delay, answer)


@SIM
@given(
    windows=st.lists(window_strategy, min_size=1, max_size=3),
    instances=st.integers(min_value=2, max_value=4),
    reserve=reserves,
    latency=st.sampled_from([0.0, 0.5]),
    concurrency=st.integers(min_value=1, max_value=6),
)
def test_instances_together_stay_within_the_allowance(
    windows: list[Window], instances: int, reserve: float, latency: float, concurrency: int
) -> None:
    """Several instances, each with its share, send no more together than one would."""
    server = Server(windows, rounding=True)
    cores = [pacer_core(reserve=reserve, share=1 / instances) for _ in range(instances)]
    run(server, cores, concurrency, latency)
    for i, window in enumerate(windows):
        assert server.worker[i] <= max(instances, allowed(window, reserve)), (i, server.worker)


@SIM
@given(
    length=st.sampled_from([60.0, 600.0, 3600.0]),
    limit=st.integers(min_value=2, max_value=300),
    reserve=reserves,
    latency=st.sampled_from([0.0, 0.05, 1.0]),
    concurrency=st.integers(min_value=1, max_value=8),
)
def test_without_other_traffic_no_429_and_spread_out(
    length: float, limit: int, reserve: float, latency: float, concurrency: int
) -> None:
    """Alone on the budget, the worker is never refused and never bursts."""
    window = Window(length, limit)
    server = Server([window] * 3, rounding=True)
    run(server, [pacer_core(reserve=reserve)], concurrency, latency)
    assert server.refused == [0, 0, 0]
    # Usable time: the window less what uncertainty about its reset costs at each end
    # (latency, whole-second rounding, the margin, the probe's round trip).
    usable = length - (2 * latency + 3)
    per_tenth = allowed(window, reserve) * (length / 10) / usable
    for t in server.sends:
        burst = sum(1 for u in server.sends if t <= u < t + length / 10)
        assert burst <= math.ceil(per_tenth) + 2


counts = st.none() | st.sampled_from([0, 1, 2**31, 2**63, -1]) | st.integers(0, 10**6)
absurd = st.sampled_from([0.0, 1.0, 2.0**63, -1.0, math.nan, math.inf])
seconds = st.none() | absurd | st.floats(0, 7200)
answers = st.tuples(
    st.floats(min_value=0.0, max_value=3600.0),  # seconds since the previous answer
    st.builds(
        RateLimitInfo,
        limit=counts,
        remaining=counts,
        reset_after=seconds,
        window=seconds,
        retry_after=seconds,
    ),
    st.sampled_from([200, 429, None]),
)


@SIM
@given(steps=st.lists(answers, min_size=1, max_size=30), reserve=reserves)
def test_any_stated_budget_never_makes_the_pacer_spin_or_raise(
    steps: list[tuple[float, RateLimitInfo, int | None]], reserve: float
) -> None:
    """Absurd figures (0, 2^63, NaN, negative): no raise, every wait finite, then the permit."""
    core = pacer_core(reserve=reserve, fallback_per_hour=60)
    t = 1e6
    for gap, answer, status in steps:
        t += gap
        delay, _ = core.delay(t)
        assert 0.0 <= delay < math.inf
        assert core.delay(t + delay)[0] == 0.0
        t += delay
        core.reserve(t)
        core.observe(t, answer, status, sent_at=t)
        core.snapshot(t)


def test_spends_the_allowance_when_alone() -> None:
    """Pacing does not waste the budget: the worker sends its whole allowance per window."""
    window = Window(3600.0, 120)
    server = Server([window] * 3, rounding=True)
    run(server, [pacer_core(reserve=0.1)], 8, 0.5)
    assert server.worker == [108, 108, 108]


# -- single rules --------------------------------------------------------------------------------


def info(remaining: int, reset: float, limit: int | None = 100, **kw: float) -> RateLimitInfo:
    """Rate limit figures as an answer would carry them."""
    return RateLimitInfo(limit=limit, remaining=remaining, reset_after=reset, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("burst", [1, 5])
def test_before_any_header_the_burst_goes_at_once_then_the_fallback_rate(burst: int) -> None:
    """Before any header, `initial_burst` permits go at once, then one per fallback interval."""
    core = pacer_core(fallback_per_hour=60, initial_burst=burst)
    assert [core.reserve(0.0) for _ in range(burst)] == [0.0] * burst
    assert [core.reserve(0.0) for _ in range(2)] == pytest.approx([60.0, 120.0])


@given(
    times=st.lists(st.floats(min_value=0, max_value=20_000), min_size=1, max_size=200),
    burst=st.integers(min_value=1, max_value=8),
)
def test_fallback_rate_with_burst_is_bounded(times: list[float], burst: int) -> None:
    """Without headers, no hour holds more than the burst plus fallback_per_hour permits."""
    core = pacer_core(fallback_per_hour=30, initial_burst=burst)
    slots = sorted(t + core.reserve(t) for t in sorted(times))
    for s in slots:
        assert sum(1 for u in slots if s <= u < s + 3600) <= 30 + burst


def test_allowance_is_spread_over_the_time_left() -> None:
    """The i-th permit of A goes at i * time_left / A, whatever burst was configured."""
    core = pacer_core(reserve=0.0, initial_burst=5)
    core.observe(0.0, info(remaining=10, reset=100.5, limit=10), 200)
    slots = [core.reserve(0.0) for _ in range(10)]
    assert slots == pytest.approx([0.0, 10.05, 20.1, 30.15, 40.2, 50.25, 60.3, 70.35, 80.4, 90.45])


@pytest.mark.parametrize(
    ("reserve", "share", "remaining", "limit", "allowance"),
    [
        pytest.param(0.2, 0.5, 100, 100, 40, id="share"),  # (100 - 20) * 0.5
        pytest.param(0.1, 1.0, 50, 120, 38, id="docs-config-example"),  # 50 - 12, not 45
    ],
)
def test_the_allowance_is_remaining_less_the_reserve_of_the_limit_times_the_share(
    reserve: float, share: float, remaining: int, limit: int, allowance: int
) -> None:
    """The allowance is remaining less reserve*limit, times the instance's share."""
    core = pacer_core(reserve=reserve, share=share)
    core.observe(0.0, info(remaining=remaining, reset=1000.5, limit=limit), 200)
    assert sum(1 for _ in range(60) if core.reserve(0.0) < 1000.5) == allowance


def test_spent_allowance_waits_for_the_reset() -> None:
    """Once the allowance is spent the next permit waits for the reset (plus a margin)."""
    core = pacer_core(reserve=0.0)
    core.observe(0.0, info(remaining=2, reset=30.5, limit=10), 200)
    assert core.reserve(0.0) == 0.0
    assert core.reserve(0.0) == pytest.approx(15.25)
    delay, reason = core.delay(16.0)
    assert (delay, reason) == (pytest.approx(30.5 + 1.0 - 16.0), "exhausted")


@given(
    fallback=st.sampled_from([30.0, 60.0, 360.0]),
    reserve=reserves,
    left=st.floats(min_value=0.0, max_value=1.0),
    latency=st.floats(min_value=0.0, max_value=5.0),
)
def test_spent_answers_with_a_reset_already_past_keep_the_fallback_rate(
    fallback: float, reserve: float, left: float, latency: float
) -> None:
    """Spent answers with a reset already past never beat the fallback rate."""
    core = pacer_core(reserve=reserve, fallback_per_hour=fallback)
    remaining = math.floor(left * reserve * 100)  # within the reserve: nothing for the worker
    sends: list[float] = []
    t = 0.0
    while t < 2 * 3600.0 and len(sends) <= 3 * fallback:
        delay, _ = core.delay(t)
        if delay > 0:
            t += delay
            continue
        core.reserve(t)
        sends.append(t)
        t += latency
        core.observe(t, info(remaining, 0.0, limit=100), 200, sent_at=sends[-1])
    for i, s in enumerate(sends):
        assert bisect_left(sends, s + 3600) - i <= fallback + 1, len(sends)


def test_a_short_window_is_not_taken_for_an_hour() -> None:
    """A 10-second window with 5 requests is paced over those 10 seconds."""
    core = pacer_core(reserve=0.0)
    core.observe(0.0, info(remaining=5, reset=10.5, limit=5, window=10.0), 200)
    assert [core.reserve(0.0) for _ in range(5)] == pytest.approx([0.0, 2.1, 4.2, 6.3, 8.4])


def test_in_flight_permits_are_counted() -> None:
    """An answer that does not yet reflect requests in flight cannot reopen the budget."""
    core = pacer_core(reserve=0.0)
    core.observe(0.0, info(remaining=4, reset=100.0, limit=4), 200)
    for _ in range(3):
        core.reserve(0.0)  # three requests in flight
    core.observe(1.0, info(remaining=3, reset=99.0, limit=4), 200)  # reflects only one
    assert core.snapshot(1.0).remaining == 1
    core.reserve(1.0)
    assert core.delay(1.0)[1] == "exhausted"


def test_other_traffic_lowers_the_allowance() -> None:
    """A remaining lower than the local count (other traffic) wins within the window."""
    core = pacer_core(reserve=0.0)
    core.observe(0.0, info(remaining=50, reset=100.0, limit=50), 200)
    core.reserve(0.0)
    core.observe(1.0, info(remaining=5, reset=99.0, limit=50), 200)
    assert core.snapshot(1.0).remaining == 5


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((5000, 4999, 3600.0), (50000, 49998, 3590.0)),  # raised within the window
        ((5000, 4999, 3600.0), (50000, 49998, 3600.0)),  # raised at the same reset
        ((5000, 10, 3600.0), (50000, 49990, 3590.0)),  # raised after the old one was spent
        ((50000, 49999, 3600.0), (5000, 4998, 3590.0)),  # lowered within the window
    ],
)
def test_a_changed_limit_is_followed_at_once(
    before: tuple[int, int, float], after: tuple[int, int, float]
) -> None:
    """A quota raised or lowered within a window: the next permit follows the new figures."""
    core = pacer_core(reserve=0.1)
    limit, remaining, reset = before
    core.observe(0.0, info(remaining=remaining, reset=reset, limit=limit), 200, sent_at=0.0)
    limit, remaining, reset = after
    core.observe(10.0, info(remaining=remaining, reset=reset, limit=limit), 200, sent_at=10.0)
    assert core.delay(10.0) == (0.0, "none")
    assert core.snapshot(10.0).remaining == remaining
    delays = [core.reserve(10.0) for _ in range(remaining + 1)]
    assert sum(1 for d in delays if d < reset) == math.floor(remaining - 0.1 * limit)


def test_a_late_answer_does_not_bring_back_an_old_limit() -> None:
    """An answer sent before the one that reported a new limit cannot restore the old one."""
    core = pacer_core(reserve=0.1)
    core.observe(0.0, info(remaining=4999, reset=3600.0, limit=5000), 200, sent_at=0.0)
    core.observe(10.0, info(remaining=400, reset=3590.0, limit=500), 200, sent_at=9.0)
    core.observe(11.0, info(remaining=4990, reset=3589.0, limit=5000), 200, sent_at=5.0)
    assert core.snapshot(11.0).limit == 500
    assert core.snapshot(11.0).remaining == 400


# The window in force: 100 a 3600 s window, 50 left, the reset 54 minutes away (at 3240).
BEFORE = info(remaining=50, reset=3240.0, limit=100, window=3600.0)


@pytest.mark.parametrize(
    ("answer", "window", "reset_in", "remaining"),
    [
        # A longer window: its reset moved later, a new window from its figures.
        ((info(200, 7000.0, limit=200, window=7200.0), 200, 10.0), 7200.0, 7000.0, 200),
        # A shorter window (a budget raised): the earlier reset and its figures at once.
        ((info(1196, 300.0, limit=1200, window=600.0), 200, 10.0), 600.0, 300.0, 1196),
        # The same window restarted earlier by the service.
        ((info(99, 60.0, limit=100, window=3600.0), 200, 10.0), 3600.0, 60.0, 99),
        # A later reset (the window rolled over): a new window.
        ((info(99, 3590.0, limit=100, window=3600.0), 200, 10.0), 3600.0, 3590.0, 99),
        # A 429: everything paused until Retry-After, the window spent.
        ((info(0, 3230.0, limit=100, retry_after=30.0), 429, 10.0), 3600.0, 30.0, 0),
        # A late answer (sent before the window in force was reported) changes nothing.
        ((info(0, 10.0, limit=100, window=600.0), 200, -5.0), 3600.0, 3230.0, 49),
        # A shorter window reported without a reset: the reset is never beyond it.
        ((RateLimitInfo(limit=100, window=600.0), 200, 10.0), 600.0, 601.0, 49),
    ],
    ids=["longer", "shorter", "earlier-reset", "later-reset", "429", "late", "window-only"],
)
def test_window_transitions(
    answer: tuple[RateLimitInfo, int, float], window: float, reset_in: float, remaining: int
) -> None:
    """Each kind of answer: the window, reset and remaining then; the reset within the window."""
    core = pacer_core(reserve=0.1, max_wait=timedelta(hours=3))
    core.observe(0.0, BEFORE, 200, sent_at=0.0)
    core.reserve(0.0)
    figures, status, sent_at = answer
    core.observe(10.0, figures, status, sent_at=sent_at)
    snap = core.snapshot(10.0)
    assert (snap.window, snap.remaining) == (window, remaining)
    assert snap.reset_in == pytest.approx(reset_in)
    assert snap.reset_in <= snap.window + 1.0


def test_an_earlier_reset_with_a_shorter_window_is_paced_at_once() -> None:
    """A budget raised with a shorter window: the reads left go at the new pace at once."""
    core = pacer_core(reserve=0.1)
    core.observe(0.0, BEFORE, 200, sent_at=0.0)
    core.reserve(0.0)
    core.observe(10.0, info(1196, 300.0, limit=1200, window=600.0), 200, sent_at=10.0)
    delays = [core.reserve(10.0) for _ in range(100)]
    assert max(delays) < 30.0  # 1,076 usable over 300 s: a hundred within half a minute


def test_429_pauses_every_permit_until_retry_after() -> None:
    """After a 429 nothing goes before Retry-After; then one probe, then the slow rate."""
    core = pacer_core(fallback_per_hour=60)
    core.observe(0.0, info(remaining=50, reset=3000.0), 200)
    core.observe(5.0, info(remaining=0, reset=2995.0, retry_after=30.0), 429)
    for t in (5.0, 10.0, 34.9):
        delay, reason = core.delay(t)
        assert t + delay >= 35.0
        assert reason == "retry_after"
    assert core.paused_for(20.0) == pytest.approx(15.0)
    assert core.reserve(35.0) == pytest.approx(1.0)  # the probe, just past the pause
    assert core.reserve(36.0) >= 60.0  # then the conservative rate until a header


def test_answers_that_overtook_a_429_do_not_reopen_the_budget() -> None:
    """A 200 arriving during a 429 pause leaves the pause and the spent window alone."""
    core = PacerCore()
    core.observe(0.0, info(remaining=0, reset=100.0, retry_after=100.0), 429)
    core.observe(1.0, info(remaining=80, reset=99.0), 200)
    assert core.delay(1.0)[0] >= 99.0


def test_429_without_figures_pauses_a_minute() -> None:
    """A bare 429 still pauses, for a sane default."""
    core = PacerCore()
    core.observe(0.0, None, 429)
    assert core.paused_for(0.0) == 60.0


def test_set_share_reaches_the_core_and_is_validated() -> None:
    """set_share changes the core's share, which must be in (0, 1]."""
    pacer, _ = make_pacer()
    pacer.set_share(0.5)
    assert pacer.core.share == 0.5
    with pytest.raises(ValueError, match="share"):
        pacer.core.share = 0.0


# -- the async shell -------------------------------------------------------------------------------


class FakeClock:
    """Monotonic seconds that only move when a sleeper sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()


WALL = datetime(2025, 1, 1, tzinfo=UTC)


def make_pacer(**ratelimit: Any) -> tuple[Pacer, FakeClock]:
    clock = FakeClock()
    return Pacer(pacer_core(**ratelimit), clock, clock.sleep, wall_clock=lambda: WALL), clock


@pytest.mark.anyio
async def test_acquire_sleeps_on_the_injected_clock() -> None:
    """acquire waits by the injected sleep, never the real one, and paces by the headers."""
    pacer, clock = make_pacer(reserve=0.0)
    pacer.feed(None, {"ratelimit": '"p";r=3;t=31', "ratelimit-policy": '"p";q=3;w=60'}, 200)
    start = clock.now
    for _ in range(3):
        await pacer.acquire()
    assert clock.now - start == pytest.approx(20.0, abs=0.01)  # 0, 10, 20: spread over 30 s


@pytest.mark.anyio
async def test_429_holds_every_waiter() -> None:
    """A 429 fed while others wait holds all of them until Retry-After."""
    pacer, clock = make_pacer()
    pacer.feed(None, {"ratelimit": '"p";r=100;t=3600'}, 200)
    permit = await pacer.acquire()
    pacer.feed(permit, {"retry-after": "120"}, 429)
    released: list[float] = []

    async def waiter() -> None:
        await pacer.acquire()
        released.append(clock.now)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(waiter)
    assert len(released) == 3
    assert min(released) >= 1000.0 + 120.0
    assert max(clock.slept) <= RECHECK


@pytest.mark.anyio
async def test_feed_uses_the_time_since_acquire_as_latency() -> None:
    """The reset of an answer is measured from when its permit was granted."""
    pacer, clock = make_pacer(reserve=0.0)
    permit = await pacer.acquire()
    clock.now += 5.0  # a slow answer
    pacer.feed(permit, {"ratelimit": '"p";r=1;t=10.5', "ratelimit-policy": '"p";q=2'}, 200)
    # Usable until the earliest end (send + 10.5), then only past the latest (+ margin).
    assert pacer.core.delay(1010.4) == (0.0, "none")
    assert pacer.core.delay(1010.6) == (pytest.approx(5.9), "exhausted")


@pytest.mark.anyio
async def test_long_waits_are_logged() -> None:
    """A wait over a second logs `ratelimit.wait` with its reason."""
    pacer, _ = make_pacer(fallback_per_hour=60)
    with capture_logs() as logs:
        await pacer.acquire()
        await pacer.acquire()
    waits = [e for e in logs if e["event"] == "ratelimit.wait"]
    assert len(waits) == 1
    assert waits[0]["reason"] == "pacing"
    assert waits[0]["wait_s"] == pytest.approx(60.0)


def test_budget_seen_reports_the_last_answer() -> None:
    """budget_seen turns the last reported figures into a storage record."""
    pacer, clock = make_pacer()
    assert pacer.budget_seen(WALL) is None
    pacer.feed(
        None,
        {"x-ratelimit-limit": "120", "x-ratelimit-remaining": "80", "x-ratelimit-reset": "600"},
        200,
    )
    clock.now += 10
    seen = pacer.budget_seen(WALL)
    assert seen is not None
    assert (seen.limit, seen.remaining) == (120, 80)
    assert seen.reset_at == WALL + timedelta(seconds=590)
    assert seen.observed_at == WALL - timedelta(seconds=10)
    snap = pacer.snapshot()
    assert (snap.limit, snap.remaining) == (120, 80)


@pytest.mark.anyio
async def test_a_wait_cut_short_by_an_answer_is_not_logged() -> None:
    """A permit held back only until the answer in flight brings the budget is not logged."""
    pacer, clock = make_pacer(fallback_per_hour=60)
    first = await pacer.acquire()  # the initial burst: the next one is planned a minute away

    async def answer() -> None:
        await anyio.lowlevel.checkpoint()  # the second acquire is waiting by now
        pacer.feed(first, {"ratelimit": '"p";r=9000;t=60', "ratelimit-policy": '"p";q=9000'}, 200)

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(answer)
            await pacer.acquire()
    assert [e for e in logs if e["event"] == "ratelimit.wait"] == []
    assert clock.now - 1000.0 <= RECHECK
