"""The freshness schedule: the change estimate, the budget's spread, and stats on change."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from operator import mul
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lta_worker.config import PollSettings
from lta_worker.domain import (
    ChangeEstimate,
    EncryptedToken,
    Outcome,
    SchedulePlan,
    UserRow,
    bucket_rates,
    canonical_json,
    day_shape,
    decide_turn,
    expected_delay,
    plan_scale,
    population_prior,
    still_wanted,
)
from lta_worker.domain._capacity import PLAN_SHARE, rate_class, reads_per_hour
from lta_worker.domain._estimate import (
    BINS,
    DEFAULT_PRIOR,
    GRID,
    GRID_SIZE,
    LENGTHS,
    MAX_RATE,
    SUMMARY_BINS,
    SUMMARY_SECONDS,
    WINDOW_HOURS,
    WINDOW_PRIOR,
    WINDOWS,
    content_hash,
    observe,
    update_belief,
)
from lta_worker.domain._freshness import (
    CAP_SHARE,
    RESOLUTION,
    FreshnessConfig,
    cap_seconds,
    fold_turn,
    interval_for,
    next_due,
    read_cost,
    stats_still_wanted,
    wants_stats,
)
from lta_worker.protocol import LATEST_CHANGE_SCOPE, STATS_SCOPE

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
FIXED = PollSettings(schedule="fixed", stats="always", interval=HOUR).policy().freshness
ADAPTIVE = FreshnessConfig(
    schedule="adaptive",
    interval=timedelta(minutes=15),
    max_interval=timedelta(hours=24),
    stats="on_change",
    stats_max_age=timedelta(hours=24),
    rate_half_life=timedelta(days=3),
)

durations = st.floats(min_value=1.0, max_value=30 * 86400.0).map(lambda s: timedelta(seconds=s))


def _distribution(size: int) -> st.SearchStrategy[tuple[float, ...]]:
    return (
        st.tuples(*[st.floats(0.0, 1.0)] * size)
        .filter(lambda w: sum(w) > 1e-6)
        .map(lambda w: tuple(x / sum(w) for x in w))
    )


def _only(start: int, length: int) -> tuple[float, ...]:
    """A window belief certain of the window of `length` hours from `start` (UTC)."""
    return tuple(float(w[:2] == (start, start + length)) for w in WINDOWS)


def _mean(weights: tuple[float, ...]) -> float:
    return sum(w * g for w, g in zip(weights, GRID, strict=True))


estimates = st.builds(
    ChangeEstimate,
    window=st.one_of(st.none(), _distribution(len(WINDOWS))),
    content=st.one_of(st.none(), st.sampled_from(["a", "b"])),
    seen_at=st.one_of(st.none(), durations.map(lambda d: NOW - d)),
    stats_at=st.one_of(st.none(), durations.map(lambda d: NOW - d)),
    belief=st.one_of(st.none(), st.tuples(*[st.floats(0.0, 1.0)] * GRID_SIZE)).map(
        lambda b: None if b is None or sum(b) <= 0 else tuple(x / sum(b) for x in b)
    ),
).map(lambda e: replace(e, level=None if e.belief is None else _mean(e.belief)))
configs = st.builds(
    lambda low, extra, **more: replace(ADAPTIVE, interval=low, max_interval=low + extra, **more),
    durations,
    durations,
    schedule=st.sampled_from(["fixed", "adaptive"]),
    stats=st.sampled_from(["always", "on_change"]),
    stats_max_age=durations,
)
plans = st.builds(
    SchedulePlan,
    scale=st.floats(min_value=0.0, max_value=1e6),
    shape=st.tuples(*[st.floats(min_value=0.05, max_value=6.0)] * BINS),
)


@given(est=st.one_of(st.none(), estimates), plan=plans, cfg=configs)
def test_next_due_is_never_before_now_nor_after_now_plus_max_interval(
    est: ChangeEstimate | None, plan: SchedulePlan, cfg: FreshnessConfig
) -> None:
    """A user read now is due in (now, now + max_interval], at `interval` when fixed."""
    due = next_due(est, NOW, plan, cfg)
    assert NOW < due <= NOW + cfg.max_interval
    if cfg.schedule == "fixed":
        assert due == NOW + cfg.interval
    else:
        assert due >= NOW + cfg.interval


@given(est=estimates, content=st.sampled_from(["a", "b", "c"]), later=durations)
def test_an_observation_keeps_the_estimate_bounded_and_a_change_never_lowers_it(
    est: ChangeEstimate, content: str, later: timedelta
) -> None:
    """After any read: the window a distribution, its shape's mean one, rates in (0, MAX_RATE]."""
    after = observe(est, content, NOW + later, ADAPTIVE)
    window = after.window if after.window is not None else WINDOW_PRIOR
    assert len(window) == len(WINDOWS)
    assert all(w >= 0 for w in window)
    assert sum(window) == pytest.approx(1.0)
    assert sum(after.hourly()) / BINS == pytest.approx(1.0)
    assert all(0 < r <= MAX_RATE for r in after.rates())
    assert (after.content, after.seen_at, after.stats_at) == (content, NOW + later, est.stats_at)
    base = replace(est, content="a", seen_at=NOW)
    same, moved = (observe(base, c, NOW + later, ADAPTIVE).level for c in "ab")
    assert same is not None and moved is not None
    assert moved >= same


beliefs = st.tuples(*[st.floats(0.0, 1.0)] * GRID_SIZE).filter(lambda b: sum(b) > 1e-6)


@given(
    belief=st.one_of(st.none(), beliefs),
    moved=st.booleans(),
    span=st.floats(0.0, 1e7),
    seconds=st.floats(0.0, 1e7),
)
def test_a_belief_stays_a_distribution_over_the_grid(
    belief: tuple[float, ...] | None, moved: bool, span: float, seconds: float
) -> None:
    """After any read the belief is a distribution over GRID, its mean a rate within the grid."""
    if belief is not None:
        belief = tuple(b / sum(belief) for b in belief)
    after = update_belief(
        belief, moved, span=span, seconds=seconds, cfg=ADAPTIVE, prior=DEFAULT_PRIOR
    )
    assert len(after) == GRID_SIZE
    assert all(b >= 0 for b in after)
    assert sum(after) == pytest.approx(1.0)
    assert GRID[0] * 0.999 <= _mean(after) <= GRID[-1] * 1.001


@given(belief=beliefs, span=st.floats(1.0, 1e6), seconds=st.floats(0.0, 1e7))
def test_a_change_seen_never_believes_a_lower_rate_than_none_seen(
    belief: tuple[float, ...], span: float, seconds: float
) -> None:
    """From one belief, a read that saw a change gives a level no lower than one that saw none."""
    update = partial(update_belief, span=span, seconds=seconds, cfg=ADAPTIVE, prior=DEFAULT_PRIOR)
    belief = tuple(b / sum(belief) for b in belief)
    assert _mean(update(belief, True)) >= _mean(update(belief, False)) * (1 - 1e-9)


def test_the_population_prior_is_the_mean_belief_with_a_floor_of_the_default() -> None:
    """A population of busy users gives a prior far above the default, ruling out no rate."""
    t, busy = NOW, ChangeEstimate()
    for n in range(40):
        t += 2 * HOUR
        busy = observe(busy, str(n), t, ADAPTIVE)
    prior = population_prior([busy] * 10 + [ChangeEstimate()])
    assert sum(prior) == pytest.approx(1.0)
    assert all(p > 0 for p in prior)
    assert _mean(prior) > 5 * _mean(DEFAULT_PRIOR)
    assert population_prior([]) == DEFAULT_PRIOR


def test_a_busy_user_is_believed_as_busy_as_the_population_says() -> None:
    """With the population's prior, reads every 2 h of a user changing 30 times a day in 16
    waking hours estimate it within a third (a fixed prior held it at a third to a half)."""
    rng = random.Random(7)
    t, est, version, prior = NOW, ChangeEstimate(), 0, None
    for step in range(7 * 12):
        t += 2 * HOUR
        awake = 7 <= t.hour < 23
        version += sum(1 for _ in range(240) if awake and rng.random() < 30 / 16 * 2 / 240)
        est = observe(est, str(version), t, ADAPTIVE, prior)
        if step % 12 == 0:
            prior = population_prior([est] * 3)
    assert 20 < est.per_day() < 40


def test_a_user_who_wakes_after_days_idle_is_relearned_within_a_day() -> None:
    """Idle for ten days, then changing at each 2-hourly read: over 10 a day within a day."""
    t, est = NOW, ChangeEstimate()
    for _ in range(12):
        t += 20 * HOUR
        est = observe(est, "same", t, ADAPTIVE)
    assert est.per_day() < 0.5
    for n in range(12):
        t += 2 * HOUR
        est = observe(est, str(n), t, ADAPTIVE)
    assert est.per_day() > 10


@given(
    start=st.integers(0, BINS - 1),
    length=st.sampled_from(LENGTHS),
    phase=st.integers(0, 189).map(lambda m: timedelta(minutes=m)),
)
def test_a_user_who_changes_only_in_a_window_of_hours_gets_that_window_within_days(
    start: int, length: int, phase: timedelta
) -> None:
    """A user changing only in a window of hours (UTC), read every 3 h 10 min, is believed
    within 30 reads to change 3 times as fast inside the window (edges left out) as outside."""
    inside = {(start + h) % BINS for h in range(1, length - 1)}
    outside = {(start + length + h) % BINS for h in range(1, BINS - length - 1)}
    t, est, version = NOW + phase, ChangeEstimate(), 0
    for _ in range(30):
        span = [t + timedelta(minutes=m) for m in range(0, 190, 10)]
        version += any((s.hour - start) % BINS < length for s in span)
        t += timedelta(minutes=190)
        est = observe(est, str(version), t, ADAPTIVE)
    awake = sum(est.hourly()[h] for h in inside) / len(inside)
    asleep = sum(est.hourly()[h] for h in outside) / len(outside)
    assert awake > 3 * asleep


def test_a_user_who_moves_its_hours_by_half_a_day_is_believed_in_them_within_two_days() -> None:
    """Ten days awake 08-24 UTC, then 20-12, changing every 30 minutes awake, read every 90
    minutes: two days after the move its believed window starts at 19-21 h."""
    t, est, version = NOW.replace(hour=0), ChangeEstimate(), 0
    moved_at = t + timedelta(days=10)
    while t < moved_at + timedelta(days=2):
        start = 8 if t < moved_at else 20
        for half_hour in range(1, 4):
            version += ((t + half_hour * timedelta(minutes=30)).hour - start) % BINS < 16
        t += timedelta(minutes=90)
        est = observe(est, str(version), t, ADAPTIVE)
        if t == moved_at:
            assert est.window is not None
            assert sum(w for w, k in zip(est.window, WINDOWS, strict=True) if k[0] == 8) > 0.9
    assert est.window is not None
    assert (
        sum(w for w, k in zip(est.window, WINDOWS, strict=True) if 19 <= k[0] <= 21 and k[1] > 24)
        > 0.9
    )


def test_unread_for_a_half_life_a_user_keeps_most_of_its_day_and_half_its_level() -> None:
    """Unread for `rate_half_life`: the day starts over with chance 1 - 2^(-1/4), the level 1/2."""
    rate = GRID[5]  # 0.075 a day: three quiet days say little of it
    est = ChangeEstimate(
        content="a",
        seen_at=NOW,
        level=rate,
        belief=tuple(float(g == rate) for g in GRID),
        window=_only(8, 16),
    )
    after = observe(est, "a", NOW + ADAPTIVE.rate_half_life, ADAPTIVE)
    kept = 2 ** (-1 / 4)
    assert after.window is not None and after.belief is not None
    at = _only(8, 16).index(1.0)
    assert after.window[at] == pytest.approx(kept + (1 - kept) * WINDOW_PRIOR[at], rel=1e-6)
    # The half that started over is spread by the prior; then Bayes' rule with the quiet days.
    quiet = [math.exp(-g * ADAPTIVE.rate_half_life.total_seconds()) for g in GRID]
    mixed = [0.5 * p for p in DEFAULT_PRIOR]
    mixed[5] += 0.5
    assert after.belief[5] == pytest.approx(mixed[5] * quiet[5] / sum(map(mul, mixed, quiet)))


def _older_form(counts: list[float], seconds: list[float], **more: Any) -> dict[str, Any]:
    """An estimate stored before the window: counts and seconds per four-hour slice, `more`."""
    return {"c": counts, "o": seconds, "h": "a", "s": NOW.isoformat(), "t": None, **more}


@pytest.mark.parametrize(
    ("counts", "busy", "quiet"),
    [
        ([0.0, 9.0, 9.0, 9.0, 9.0, 0.0], range(5, 19), (21, 22, 23, 0, 1, 2)),  # 04-20 UTC
        ([9.0, 9.0, 0.0, 0.0, 9.0, 9.0], (*range(17, 24), *range(7)), range(9, 15)),  # 16-08
    ],
)
@pytest.mark.parametrize("w", [{}, {"w": [0] * 25}])  # or an earlier build's 16-hour windows
def test_an_estimate_stored_before_the_window_keeps_its_day(
    counts: list[float], busy: Any, quiet: Any, w: dict[str, Any]
) -> None:
    """Its hours with counts read back at least 4 times as busy as those without."""
    raw = _older_form(counts, [36000.0] * SUMMARY_BINS, b=list(DEFAULT_PRIOR), **w)
    est = ChangeEstimate.from_json(raw)
    assert est is not None and est.window is not None
    hours = est.hourly()
    assert min(hours[h] for h in busy) > 4 * max(hours[h] for h in quiet)


@given(
    counts=st.tuples(*[st.floats(0.0, 500.0)] * SUMMARY_BINS),
    seconds=st.tuples(*[st.floats(0.0, 1e7)] * SUMMARY_BINS),
)
def test_any_older_counts_read_back_as_a_window_belief(
    counts: tuple[float, ...], seconds: tuple[float, ...]
) -> None:
    """Any older counts read back as a distribution over `WINDOWS` (or none)."""
    raw = _older_form(list(counts), list(seconds))
    est = ChangeEstimate.from_json(raw)
    assert est is not None
    if est.window is not None:
        assert sum(est.window) == pytest.approx(1.0)
        assert all(w >= 0 for w in est.window)


@given(est=estimates)
def test_the_stored_form_round_trips_and_keeps_the_older_keys(est: ChangeEstimate) -> None:
    """`from_json(to_json(e))` gives back the estimate (floats to their stored precision), and
    older versions read `c`/`o`, the changes expected per slice, and `b`, the belief."""
    raw = est.to_json()
    assert len(json.dumps(raw)) < 1000  # small and bounded
    back = ChangeEstimate.from_json(raw)
    assert back is not None
    assert (back.content, back.seen_at, back.stats_at) == (est.content, est.seen_at, est.stats_at)
    if est.window is None:
        assert back.window is None
    else:
        assert back.window == pytest.approx(est.window, rel=0.11, abs=1e-8)
    if est.belief is not None:
        assert back.belief == pytest.approx(est.belief, rel=1e-3, abs=1e-12)
        assert back.level == pytest.approx(est.level, rel=1e-3)
    assert raw["o"] == [SUMMARY_SECONDS] * SUMMARY_BINS
    per = BINS // SUMMARY_BINS
    level = est.level if est.level is not None else 1 / 86400
    for k in range(SUMMARY_BINS):
        mean = sum(est.hourly()[k * per : (k + 1) * per]) / per
        assert raw["c"][k] == pytest.approx(level * mean * SUMMARY_SECONDS, abs=1e-4)
    assert (raw["b"] is None) == (est.belief is None)


@pytest.mark.parametrize(
    ("count", "seconds", "more", "low", "high"),
    [
        (10.0, 36000.0, {}, 20.4, 27.6),  # before the level: its counts' 24 a day
        # before the belief: 30 reads of 3840 s (60 s x 2^6) saw a change, 20 h of reads none
        (1.0, 3600.0, {"q": 72000.0, "m": {"12": 30.0}, "l": 3e-4}, 15.0, 45.0),
    ],
)
def test_an_estimate_stored_before_the_level_or_the_belief_keeps_its_rate(
    count: float, seconds: float, more: dict[str, Any], low: float, high: float
) -> None:
    """It reads back with a belief near the rate it stored, and its next read folds into it."""
    raw = _older_form([count] * SUMMARY_BINS, [seconds] * SUMMARY_BINS, **more)
    est = ChangeEstimate.from_json(raw)
    assert est is not None and est.level is not None and est.belief is not None
    assert low < est.per_day() < high
    assert 18.0 < observe(est, "b", NOW + HOUR, ADAPTIVE).per_day() < 30.0


@pytest.mark.parametrize("raw", [None, {}, {"c": [1.0], "o": [1.0]}, {"c": "x"}, []])
def test_a_broken_stored_estimate_starts_afresh(raw: Any) -> None:
    """Anything but a well-formed stored estimate reads as none (a fresh start)."""
    assert ChangeEstimate.from_json(raw) is None


def test_a_user_changing_every_hour_is_estimated_near_its_rate() -> None:
    """Two weeks of reads every 2 h of a user changing each hour estimate about 24 a day."""
    rng = random.Random(1)
    est, t, version = ChangeEstimate(), NOW, 0
    for _ in range(14 * 12):
        t += 2 * HOUR
        version += sum(1 for _ in range(200) if rng.random() < 2 / 200)  # about 2 per read
        est = observe(est, str(version), t, ADAPTIVE)
    assert 12 < est.per_day() < 48


def test_an_idle_user_drifts_to_the_cap_and_a_busy_one_is_read_sooner() -> None:
    """With the same plan an idle user's interval is the cap and a busy one's is shorter."""
    idle, busy = ChangeEstimate(), ChangeEstimate()
    t = NOW
    for n in range(60):
        t += 4 * HOUR
        idle = observe(idle, "same", t, ADAPTIVE)
        busy = observe(busy, str(n), t, ADAPTIVE)
    plan = plan_scale(bucket_rates([idle, busy]), 1.0, ADAPTIVE)
    idle_due, busy_due = next_due(idle, t, plan, ADAPTIVE), next_due(busy, t, plan, ADAPTIVE)
    assert busy_due < idle_due
    assert idle_due - t == CAP_SHARE * ADAPTIVE.max_interval


@given(
    rate=st.floats(min_value=1e-9, max_value=MAX_RATE),
    factor=st.floats(min_value=1.0, max_value=100.0),
    scale=st.floats(min_value=1.0, max_value=1e4),
    cfg=configs,
)
def test_the_steady_interval_stays_in_bounds_and_is_no_longer_for_a_busier_user(
    rate: float, factor: float, scale: float, cfg: FreshnessConfig
) -> None:
    """The plan's interval lies in [interval, cap], and a busier user's is never longer."""
    adaptive = replace(cfg, schedule="adaptive")
    plan = SchedulePlan(scale)
    one, busier = interval_for(rate, plan, adaptive), interval_for(rate * factor, plan, adaptive)
    assert adaptive.interval.total_seconds() <= one <= cap_seconds(adaptive)
    assert busier <= one + 1.0


@given(
    est=estimates,
    factor=st.floats(min_value=1.0, max_value=100.0),
    plan=plans.filter(lambda p: p.scale > 0),
    cfg=configs,
)
@example(  # hours clamped at MAX_RATE: mean_rate() is below the level
    est=ChangeEstimate(window=_only(0, LENGTHS[0]), level=0.015625),
    factor=1.0,
    plan=SchedulePlan(scale=1.0),
    cfg=replace(FIXED, interval=timedelta(seconds=1), max_interval=timedelta(seconds=29)),
)
def test_a_busier_user_is_never_due_later(
    est: ChangeEstimate, factor: float, plan: SchedulePlan, cfg: FreshnessConfig
) -> None:
    """Every rate times `factor` is due no later (stats read every time: a flat read price)."""
    adaptive = replace(cfg, schedule="adaptive", stats="always")
    level = est.level if est.level is not None else est.mean_rate()
    busier = replace(est, level=level * factor)
    slack = timedelta(seconds=RESOLUTION)
    assert next_due(busier, NOW, plan, adaptive) <= next_due(est, NOW, plan, adaptive) + slack


@given(x=st.floats(min_value=0.0, max_value=1e3), y=st.floats(min_value=0.0, max_value=1e3))
def test_a_read_costs_between_half_and_a_whole_turn_and_more_the_likelier_a_change(
    x: float, y: float
) -> None:
    """A read's price is in [1/2, 1] of a turn, growing with the changes expected; 1 with stats."""
    low, high = sorted((x, y))
    assert 0.5 <= read_cost(low, False, ADAPTIVE) <= read_cost(high, False, ADAPTIVE) <= 1.0
    assert read_cost(low, True, ADAPTIVE) == 1.0
    assert read_cost(low, False, replace(ADAPTIVE, stats="always")) == 1.0


def test_changes_pending_when_a_user_goes_quiet_are_read_that_night() -> None:
    """A user changing from 04:00 to 20:00 UTC, read at 19:00, is due again that night."""
    window = _only(4, 16)
    inside = max(WINDOW_HOURS[window.index(1.0)])
    est = ChangeEstimate(window=window, level=4 / 3600 / inside)  # 4 an hour in the window
    plan = SchedulePlan(scale=240.0)  # 2 h between reads at a steady 4 changes an hour
    read_at = datetime(2025, 3, 1, 19, 0, tzinfo=UTC)
    due = next_due(est, read_at, plan, replace(ADAPTIVE, stats="always"))
    assert datetime(2025, 3, 1, 21, 0, tzinfo=UTC) < due < datetime(2025, 3, 1, 21, 30, tzinfo=UTC)


@given(
    rates=st.lists(
        st.tuples(
            st.floats(min_value=1e-8, max_value=MAX_RATE),
            st.floats(min_value=1e-8, max_value=MAX_RATE),
            st.integers(min_value=1, max_value=1000).map(float),
        ),
        min_size=1,
        max_size=20,
    ),
    budget=st.floats(min_value=1.0, max_value=1e5),
)
def test_the_plan_spends_no_more_than_its_share_unless_even_the_cap_is_too_much(
    rates: list[tuple[float, float, float]], budget: float
) -> None:
    """The plan costs at most PLAN_SHARE of the budget; more budget never gives a larger scale."""
    plan = plan_scale(rates, budget, ADAPTIVE)
    spent = reads_per_hour(rates, plan.scale, ADAPTIVE)
    at_cap = reads_per_hour(rates, 1e12, ADAPTIVE)
    assert spent <= budget * PLAN_SHARE * 1.01 or spent <= at_cap * 1.01
    assert plan_scale(rates, budget * 2, ADAPTIVE).scale <= plan.scale


@pytest.mark.parametrize(
    ("budget", "low", "high"),
    [
        (1e6, 450.0, 450.0),  # scale 0, every user at interval (15 min): a change waits 7.5 min
        (10.0, 450.001, 0.85 * 86400 / 2),  # a short budget: longer, never past half the cap
    ],
)
def test_the_expected_delay_is_half_the_interval_weighted_by_changes(
    budget: float, low: float, high: float
) -> None:
    """The delay from a change to its read is half each user's interval weighted by changes."""
    rates = [(1e-4, 1e-4, 50.0), (1e-6, 1e-6, 500.0)]
    plan = plan_scale(rates, budget, ADAPTIVE)
    delay = expected_delay(rates, plan, ADAPTIVE)
    assert delay is not None
    assert low - 1e-6 <= delay <= high + 1e-6
    assert (plan.scale == 0) is (budget == 1e6)
    due = NOW + ADAPTIVE.interval
    assert (next_due(ChangeEstimate(), NOW, plan, ADAPTIVE) == due) is (budget == 1e6)


def test_the_expected_delay_weights_busy_users_more() -> None:
    """With an idle user at the cap and a busy one at `interval`, the delay is the busy one's."""
    plan = SchedulePlan(scale=60.0)
    busy, idle = (1e-3, 1e-3, 1.0), (1e-7, 1e-7, 1.0)
    delay = expected_delay([busy, idle], plan, ADAPTIVE)
    assert delay is not None
    assert delay == pytest.approx(expected_delay([busy], plan, ADAPTIVE), rel=0.01)
    assert expected_delay([], plan, ADAPTIVE) is None


def test_the_day_shape_is_one_on_average() -> None:
    """The shape's slices average one (a flat day when nobody has been observed)."""
    assert day_shape([]) == (1.0,) * BINS
    assert sum(day_shape([ChangeEstimate()])) == pytest.approx(BINS)


# -- stats on change: the table ----------------------------------------------------------

SEEN = ChangeEstimate(content=content_hash("ok", canonical_json({"at": 1})), seen_at=NOW - HOUR)
AT_1 = [("latest-change", "ok", canonical_json({"at": 1}))]


@pytest.mark.parametrize(
    ("mode", "estimate", "turn", "stats_age", "read_stats"),
    [
        ("always", SEEN, AT_1, HOUR, True),
        ("on_change", SEEN, [("latest-change", "ok", b'{"at":2}')], HOUR, True),  # it moved
        ("on_change", SEEN, AT_1, HOUR, False),  # nothing new, stats young
        ("on_change", SEEN, AT_1, 24 * HOUR, True),  # stats_max_age reached
        ("on_change", SEEN, AT_1, None, True),  # stats never read
        ("on_change", None, AT_1, HOUR, True),  # first read of the user
        ("on_change", SEEN, [], HOUR, True),  # latest-change not granted: stats is all there is
        ("on_change", SEEN, [("latest-change", "scope_denied", b"null")], HOUR, True),  # denied
    ],
)
def test_stats_is_read_per_mode_change_and_age(
    mode: str,
    estimate: ChangeEstimate | None,
    turn: list[tuple[str, str, bytes]],
    stats_age: timedelta | None,
    read_stats: bool,
) -> None:
    """Stats follows `poll.stats`: always, or on a change of latest-change, at age, or alone."""
    cfg = replace(ADAPTIVE, stats=mode)  # type: ignore[arg-type]
    if estimate is not None:
        estimate = replace(estimate, stats_at=NOW - stats_age if stats_age else None)
    assert stats_still_wanted(estimate, turn, NOW, cfg) is read_stats
    assert wants_stats(None, False, NOW, cfg)


@pytest.mark.parametrize(
    ("per_day", "name"), [(0.0, "idle"), (0.4, "idle"), (2, "light"), (8, "busy"), (40, "heavy")]
)
def test_users_are_classed_by_changes_a_day(per_day: float, name: str) -> None:
    """`status` classes users by their estimated changes a day."""
    assert rate_class(per_day) == name


# -- through the policy ------------------------------------------------------------------


def _user(estimate: ChangeEstimate | None) -> UserRow:
    return UserRow(
        7, "u-7", "active", EncryptedToken(b"x", "k"), (LATEST_CHANGE_SCOPE, STATS_SCOPE), {},
        NOW, NOW - HOUR, NOW, 0, None, None, 0, estimate,
    )  # fmt: skip


POLICY = replace(
    PollSettings(interval=timedelta(minutes=15), schedule="adaptive", stats="on_change").policy(),
    plan=SchedulePlan(scale=300.0),
)


def test_decide_turn_folds_the_read_into_the_estimate_and_schedules_within_bounds() -> None:
    """An adaptive turn stores the new estimate and is due within bounds, class `adaptive`."""
    results = [
        ("latest-change", Outcome("ok", 200, {"at": 2})),
        ("stats", Outcome("ok", 200, {"n": 5})),
    ]
    update = decide_turn(_user(SEEN), results, NOW, POLICY, random.Random(0))  # type: ignore[arg-type]
    assert update.estimate is not None
    assert update.estimate.content == content_hash("ok", canonical_json({"at": 2}))
    assert (update.estimate.stats_at, update.due_class) == (NOW, "adaptive")
    assert update.next_due_at is not None
    assert NOW + POLICY.interval <= update.next_due_at <= NOW + POLICY.max_interval


def test_decide_turn_learns_with_the_plans_prior() -> None:
    """The same read under the plan's prior of busy users is believed busier."""
    user = _user(ChangeEstimate(content=content_hash("ok", b"{}"), seen_at=NOW))
    busy = tuple(1.0 if k == GRID_SIZE - 8 else 0.0 for k in range(GRID_SIZE))
    later = NOW + 6 * HOUR
    results = [("latest-change", Outcome("ok", 200, {"changed_at": "x"}))]
    levels = []
    for prior in (None, busy):
        cfg = replace(POLICY, plan=SchedulePlan(scale=100.0, prior=prior))
        update = decide_turn(user, results, later, cfg, random.Random(1))  # type: ignore[arg-type]
        assert update.estimate is not None and update.estimate.level is not None
        levels.append(update.estimate.level)
    assert levels[1] > 10 * levels[0]


def test_still_wanted_skips_stats_only() -> None:
    """`still_wanted` never skips latest-change, and skips stats when nothing moved."""
    user = _user(replace(SEEN, stats_at=NOW - HOUR))
    same = [("latest-change", Outcome("ok", 200, {"at": 1}))]
    assert still_wanted(user, "latest-change", [], NOW, POLICY)
    assert not still_wanted(user, "stats", same, NOW, POLICY)  # type: ignore[arg-type]
    always = PollSettings(stats="always").policy()
    assert still_wanted(user, "stats", same, NOW, always)  # type: ignore[arg-type]


def test_fold_turn_ignores_answers_without_content() -> None:
    """A failed read is no observation: the estimate is left as it was."""
    turn = [("latest-change", "transient", b"null")]
    assert fold_turn(SEEN, turn, NOW, ADAPTIVE) is SEEN


def test_content_hashes_are_those_stored_by_earlier_versions() -> None:
    """A content's hash is the one earlier versions stored: none looks changed after upgrade."""
    payload = {"b": 1, "a": {"é": [1.5, None, "x"]}}
    assert content_hash("ok", canonical_json(payload)) == "88318a3c81ef2446ffe1bf467abfbc9a"
    assert content_hash("none", canonical_json(None)) == "a0375d4b33c8e17425194d21ee3a7e06"
