"""Window rules: every reported reset, wait and window is bounded, and the pacer re-learns."""

from __future__ import annotations

import math
from dataclasses import fields
from datetime import UTC, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lta_worker.pacing import Pacer, RateLimitInfo, wait_after_429
from lta_worker.pacing._ratelimit import MAX_CLOCK_SKEW, _http_date, parse_ratelimit
from lta_worker.pacing._shared import observation
from lta_worker.pacing._window import (
    DEFAULT_MAX_WAIT,
    FALLBACK_429_WAIT,
    MAX_COUNT,
    MIN_429_WAIT,
    RESET_MARGIN,
    bound,
    pause_after_429,
)
from support.hostile import hostile_ratelimit_headers

from .test_pacer import WALL, FakeClock, pacer_core
from .test_pacer import make_pacer as pacer_on_a_fake_clock

HOUR = 3600.0


@pytest.mark.parametrize(
    ("given_info", "max_wait", "expected"),
    [
        pytest.param(
            RateLimitInfo(remaining=100, reset_after=999_999_999.0, window=HOUR),
            DEFAULT_MAX_WAIT,
            RateLimitInfo(remaining=100, reset_after=HOUR, window=HOUR),
            id="31-years-within-the-window",
        ),
        pytest.param(
            RateLimitInfo(remaining=1, reset_after=1e12),
            600.0,
            RateLimitInfo(remaining=1, reset_after=600.0),
            id="no-window-max-wait",
        ),
        pytest.param(
            RateLimitInfo(remaining=1, reset_after=30.0, window=1e15),
            DEFAULT_MAX_WAIT,
            RateLimitInfo(remaining=1, reset_after=30.0, window=DEFAULT_MAX_WAIT),
            id="huge-window-capped",
        ),
        pytest.param(
            RateLimitInfo(limit=10**15, remaining=10**14, reset_after=10.0),
            DEFAULT_MAX_WAIT,
            RateLimitInfo(limit=MAX_COUNT, remaining=MAX_COUNT, reset_after=10.0),
            id="counts-fit-a-column",
        ),
        pytest.param(
            RateLimitInfo(remaining=-1, reset_after=-5.0, window=math.nan, retry_after=math.nan),
            DEFAULT_MAX_WAIT,
            RateLimitInfo(),
            id="negative-nan-dropped",
        ),
        pytest.param(
            RateLimitInfo(retry_after=math.inf, window=60.0),
            DEFAULT_MAX_WAIT,
            RateLimitInfo(retry_after=61.0, window=60.0),
            id="infinitely-far-is-the-longest",
        ),
        pytest.param(
            RateLimitInfo(retry_after=7200.0, window=60.0),
            DEFAULT_MAX_WAIT,
            RateLimitInfo(retry_after=61.0, window=60.0),
            id="retry-after-within-the-window",
        ),
    ],
)
def test_bound(given_info: RateLimitInfo, max_wait: float, expected: RateLimitInfo) -> None:
    """A reset is never trusted beyond the window (+1 s of rounding) nor max_wait."""
    assert bound(given_info, max_wait) == expected


def test_bound_uses_the_known_window() -> None:
    """An answer without a window is trusted up to the window reported before (+1 s)."""
    far = RateLimitInfo(reset_after=5000.0)
    assert bound(far, known_window=60.0) == RateLimitInfo(reset_after=61.0)
    own = RateLimitInfo(reset_after=5000.0, window=10.0)
    assert bound(own, known_window=60.0) == RateLimitInfo(reset_after=11.0, window=10.0)
    unknown = RateLimitInfo(retry_after=90.0)
    assert bound(unknown, known_window=math.nan) == unknown


def test_bound_keeps_every_field() -> None:
    """A sane answer comes out of `bound` whole, every field of RateLimitInfo included."""
    info = RateLimitInfo(
        limit=100, remaining=7, reset_after=30.0, window=60.0, retry_after=5.0, source="draft-08"
    )
    unset = [f.name for f in fields(RateLimitInfo) if getattr(info, f.name) == f.default]
    assert unset == []  # a new field must be set here, and kept by `bound`
    assert bound(info) == info


@pytest.mark.parametrize(
    ("given_info", "wait"),
    [
        pytest.param(None, FALLBACK_429_WAIT, id="nothing-said"),
        pytest.param(RateLimitInfo(retry_after=0.0), MIN_429_WAIT, id="at-least-a-second"),
        pytest.param(RateLimitInfo(retry_after=1e15), DEFAULT_MAX_WAIT, id="at-most-max-wait"),
        pytest.param(RateLimitInfo(reset_after=1e9, window=600.0), 601.0, id="window"),
        pytest.param(RateLimitInfo(retry_after=math.nan), FALLBACK_429_WAIT, id="nan"),
        pytest.param(RateLimitInfo(retry_after=-3.0), FALLBACK_429_WAIT, id="negative"),
        pytest.param(RateLimitInfo(retry_after=12.0), 12.0, id="sane"),
    ],
)
def test_pause_after_429(given_info: RateLimitInfo | None, wait: float) -> None:
    """A 429 pauses for its Retry-After (or reset), at least a second, never beyond bounds."""
    assert pause_after_429(given_info) == wait


def make_pacer(max_wait: float = DEFAULT_MAX_WAIT) -> tuple[Pacer, FakeClock]:
    return pacer_on_a_fake_clock(reserve=0.0, max_wait=timedelta(seconds=max_wait))


HOSTILE_HEADERS = [
    pytest.param({"ratelimit": '"default";r=0;t=999999999'}, id="draft-31-years"),
    pytest.param(
        {"ratelimit": '"default";r=0;t=999999999', "ratelimit-policy": '"default";q=100;w=3600'},
        id="draft-31-years-window-3600",
    ),
    pytest.param({"ratelimit": '"default";r=0;t=999999999999999'}, id="draft-15-digits"),
    pytest.param({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "999999999999"}, id="x-epoch"),
    pytest.param({"ratelimit": "limit=100, remaining=0, reset=999999999999"}, id="draft-07"),
    pytest.param(
        {"ratelimit-limit": "100", "ratelimit-remaining": "0", "ratelimit-reset": "99999999999999"},
        id="triple-epoch-ms",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize("headers", HOSTILE_HEADERS)
async def test_pacer_relearns_after_a_bounded_wait(headers: dict[str, str]) -> None:
    """After a far-future reset the pacer waits at most max_wait, sends, and takes new figures."""
    pacer, clock = make_pacer()
    pacer.feed(None, headers, 200)
    seen = pacer.budget_seen(WALL)  # the storage record of those figures: no OverflowError
    assert seen is not None and seen.reset_at is not None
    assert seen.reset_at <= WALL + timedelta(seconds=DEFAULT_MAX_WAIT + 1)
    start = clock.now
    permit = await pacer.acquire()
    assert clock.now - start <= DEFAULT_MAX_WAIT + 2  # the probe went within the bound
    # The service is sane again: its new figures apply at once.
    pacer.feed(permit, {"ratelimit": '"p";r=50;t=60', "ratelimit-policy": '"p";q=50;w=60'}, 200)
    before = clock.now
    for _ in range(5):
        permit = await pacer.acquire()
        pacer.feed(permit, {"ratelimit": '"p";r=45;t=59', "ratelimit-policy": '"p";q=50;w=60'}, 200)
    assert clock.now - before < 60.0
    snap = pacer.snapshot()
    assert snap.limit == 50 and snap.reset_in is not None and snap.reset_in <= 61


def _in(seconds: float) -> str:
    return format_datetime(WALL + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [
        pytest.param("120", 120.0, id="seconds"),
        pytest.param(_in(120), 120.0, id="date-two-minutes-ahead"),
        pytest.param("999999999999999", 600.0, id="15-digits"),
        pytest.param("9999999999999999", 600.0, id="16-digits"),
        pytest.param("9" * 400, 600.0, id="400-digits"),
        pytest.param(" 99999999999999999999 ", 600.0, id="20-digits-spaced"),
        pytest.param(_in(10**8), 600.0, id="date-years-ahead"),
        pytest.param("Fri, 31 Dec 9999 23:59:59 GMT", 600.0, id="date-year-9999"),
        pytest.param("0", MIN_429_WAIT, id="zero"),
        pytest.param(_in(-60), MIN_429_WAIT, id="date-past"),
        pytest.param("-5", FALLBACK_429_WAIT, id="negative"),
        pytest.param("soon", FALLBACK_429_WAIT, id="not-a-number"),
        pytest.param("", FALLBACK_429_WAIT, id="empty"),
    ],
)
def test_retry_after_far_ahead_waits_max_wait_in_either_form(retry_after: str, wait: float) -> None:
    """A Retry-After too far ahead (any length, or a date) waits max_wait; garbage a minute."""
    assert wait_after_429({"retry-after": retry_after}, WALL, 600.0) == wait


@settings(max_examples=300, deadline=None)
@given(
    headers=hostile_ratelimit_headers(),
    status=st.sampled_from([200, 404, 429, 503]),
    max_wait=st.sampled_from([1.0, 60.0, DEFAULT_MAX_WAIT, 86_400.0]),
)
def test_no_header_value_raises_or_escapes_the_bounds(
    headers: dict[str, str], status: int, max_wait: float
) -> None:
    """Any RateLimit value: feed, snapshot, the storage record and the shared observation hold."""
    pacer, clock = make_pacer(max_wait)
    pacer.feed(None, headers, status)
    snap = pacer.snapshot()
    for value in (snap.reset_in, snap.window, snap.paused_for):
        assert value is None or (math.isfinite(value) and value <= max_wait + 1)
    for count in (snap.limit, snap.remaining, snap.reported_remaining):
        assert count is None or 0 <= count <= MAX_COUNT
    delay, _ = pacer.core.delay(clock.now)
    assert 0 <= delay <= max_wait + 2
    seen = pacer.budget_seen(WALL)
    if seen is not None and seen.reset_at is not None:
        assert seen.reset_at <= WALL + timedelta(seconds=max_wait + 1)
    shared = observation(parse_ratelimit(headers, WALL), status, WALL, max_wait=max_wait)
    if shared is not None and shared.reset_at is not None:
        assert shared.reset_at <= WALL + timedelta(seconds=max_wait + 1)


# -- the answer's Date ------------------------------------------------------------------------

EPOCH = int(WALL.timestamp())
YEAR_9999 = "Fri, 31 Dec 9999 23:59:59 GMT"
YEAR_1970 = "Thu, 01 Jan 1970 00:00:00 GMT"
SPENT_FORMS = ["x-ratelimit", "triple", "draft-07", "draft-08"]


def spent(form: str, reset_epoch: int, date: str | None) -> dict[str, str]:
    """An answer with nothing remaining and an epoch reset, in one of the header forms."""
    headers = {
        "x-ratelimit": {
            "X-RateLimit-Limit": "100",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(reset_epoch),
        },
        "triple": {
            "RateLimit-Limit": "100",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(reset_epoch),
        },
        "draft-07": {"RateLimit": f"limit=100, remaining=0, reset={reset_epoch}"},
        "draft-08": {"RateLimit": f'"p";r=0;t={reset_epoch}', "RateLimit-Policy": '"p";q=100'},
    }[form]
    return headers if date is None else {**headers, "Date": date}


@pytest.mark.parametrize("form", SPENT_FORMS)
@pytest.mark.parametrize("date", [YEAR_9999, YEAR_1970, None])
def test_a_spent_window_waits_for_its_reset_whatever_the_date(form: str, date: str | None) -> None:
    """Remaining 0, epoch reset 30 s ahead: the wait is ~30 s with a Date in 9999 or 1970."""
    pacer, clock = make_pacer()
    pacer.feed(None, spent(form, EPOCH + 30, date), 200)
    delay, reason = pacer.core.delay(clock.now)
    assert reason == "exhausted"
    assert delay == pytest.approx(30.0 + RESET_MARGIN)


@pytest.mark.anyio
@pytest.mark.parametrize("date", [YEAR_9999, YEAR_1970])
async def test_a_hostile_date_does_not_let_requests_past_a_spent_window(date: str) -> None:
    """A service answering remaining 0, reset 30 s ahead, Date absurd: no request before it."""
    clock = FakeClock()
    core = pacer_core(reserve=0.0)
    pacer = Pacer(
        core, clock, clock.sleep, wall_clock=lambda: WALL + timedelta(seconds=clock.now - 1000)
    )
    reset = EPOCH + 30
    sends: list[float] = []
    while clock.now < 1000 + 29 and len(sends) < 50:
        permit = await pacer.acquire()
        sends.append(clock.now - 1000)
        pacer.feed(permit, spent("x-ratelimit", reset, date), 200)
    assert sends[:1] == [0.0]  # the first request, before any header was known
    assert all(t >= 30.0 for t in sends[1:]), sends


# Any Date: arbitrary datetimes (mostly far off), ones near the local clock, and garbage.
any_date = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(lambda d: format_datetime(d, usegmt=True)),
    st.floats(min_value=-2 * MAX_CLOCK_SKEW, max_value=2 * MAX_CLOCK_SKEW).map(
        lambda s: format_datetime(WALL + timedelta(seconds=s), usegmt=True)
    ),
    st.text(max_size=40),
)


@given(
    date=any_date, ahead=st.integers(min_value=1, max_value=3600), form=st.sampled_from(SPENT_FORMS)
)
def test_no_date_makes_a_spent_window_wait_less_than_its_reset(
    date: str, ahead: int, form: str
) -> None:
    """Remaining 0, reset `ahead` s away: the wait is that, plus a plausible lag of the Date."""
    pacer, clock = make_pacer()
    headers = spent(form, EPOCH + ahead, date)
    pacer.feed(None, headers, 200)
    delay, reason = pacer.core.delay(clock.now)
    server = _http_date(date)
    lag = 0.0 if server is None else (WALL - server).total_seconds()
    lag = lag if 0.0 < lag <= MAX_CLOCK_SKEW else 0.0
    assert reason == "exhausted"
    assert delay >= ahead
    assert delay == pytest.approx(min(ahead + lag, DEFAULT_MAX_WAIT) + RESET_MARGIN)
