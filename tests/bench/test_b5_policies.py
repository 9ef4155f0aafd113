"""B5's yardsticks (bench/b5_policies.py): round robin, round robin on change, the oracle;
the cohort of new users (bench/b5_cohort.py); the learner told the model (bench/b5_bayes.py)."""

from __future__ import annotations

import itertools
import math
import random
from datetime import timedelta

import pytest
from bench.b5_freshness import START, measure, pooled, worker
from bench.b5_policies import (
    Schedule,
    accrued_delay,
    oracle,
    round_robin,
    round_robin_on_change,
)
from bench.b5_told import TrueRates, told
from bench.b5_workload import Workload, WorkloadUser

from bench import b5_bayes, b5_cohort, workloads
from lta_worker.domain import ChangeEstimate

# The oracle's limits, where they do not matter.
A_DAY = {"max_interval": 24.0, "stats_max_age": 24.0}


def test_round_robin_reads_each_user_in_turn_both_endpoints() -> None:
    """Two users, 4 reads an hour, 2 hours: turns alternate and arrive with the stats read."""
    s = round_robin(2, 4.0, 2.0)
    assert s.stats == s.turns == [[0.25, 1.25], [0.75, 1.75]]
    assert (s.reads, s.per_user_reads) == (8, [4, 4])


def test_round_robin_on_change_reads_stats_only_after_a_change() -> None:
    """User 0 changes at 0.1 h: its next turn reads stats; user 1's unchanged turn does not."""
    s = round_robin_on_change([[0.1], []], 10.0, 0.75, stats_max_age=24.0)
    # t=0 u0 (first: both), 0.2 u1 (first: both), 0.4 u0 (changed: both), 0.6 u1, 0.7 u0.
    assert s.turns == [pytest.approx([0.1, 0.5, 0.7]), pytest.approx([0.3, 0.6])]
    assert s.stats == [pytest.approx([0.1, 0.5]), pytest.approx([0.3])]
    assert s.reads == 8


def test_round_robin_on_change_reads_stats_when_they_are_too_old() -> None:
    """With no change at all, stats are still read once `stats_max_age` has passed."""
    s = round_robin_on_change([[]], 1.0, 6.0, stats_max_age=2.5)
    # Latest-change at 0 (+ stats at 1), 2, 3 (+ stats at 4: 3 >= 1 + 2.5? no; 4 >= 3.5 yes).
    assert s.stats == [[1.0, 5.0]]


def test_round_robin_on_change_passes_over_users_not_yet_enrolled() -> None:
    """User 1 enrolls at 1 h: until then user 0 has every slot; then they alternate."""
    s = round_robin_on_change([[], []], 4.0, 2.0, stats_max_age=24.0, enrolled=[0.0, 1.0])
    # u0 at 0 (both reads, arrives 0.25), 0.5, 0.75 (latest-change only); u1 at 1 (both).
    assert s.turns[0][:3] == [0.25, 0.5, 0.75]
    assert min(s.turns[0][3:]) > s.turns[1][0] == 1.25


def test_nobody_enrolled_yet_moves_round_robin_on_to_the_first_enrollment() -> None:
    s = round_robin_on_change([[]], 1.0, 5.0, stats_max_age=24.0, enrolled=[2.5])
    assert s.turns == [[3.5, 4.5]]


def test_the_cohort_figures_count_from_enrollment() -> None:
    """Time to first read from enrollment; delays of the changes in the first days only."""
    w = Workload(14, (WorkloadUser("a", "x", (1.0,)), WorkloadUser("b", "x", (169.0, 250.0))))
    s = Schedule([[2.0, 200.0], [168.5, 170.0, 260.0]], [[], []])
    fig = b5_cohort.figures(w, s, [0.0, 168.0], 168.0, 336.0)
    assert (fig["users"], fig["first_read_mean_h"], fig["first_read_max_h"]) == (1, 0.5, 0.5)
    assert (fig["mean_delay_h"], fig["changes"]) == (1.0, 1)  # 250 is after the first 3 days


def test_a_new_user_read_after_a_settled_user_not_overdue_is_counted() -> None:
    """Settled user 0 was due at 3 h (not overdue at the enrollment, 2 h) and read at 3 h;
    user 1, overdue (due 1.5 h), at 2.2 h; the new user 2 only at 4 h: one pair out of turn."""
    s = Schedule([[1.0, 3.0], [0.5, 2.2], [4.0]], [[], [], []])
    s.dues = [[3.0, 9.0], [1.5, 9.0], [9.0]]
    assert b5_cohort.read_out_of_turn(s, [0.0, 0.0, 2.0], 2.0) == 1
    s.turns[2] = [2.1]
    assert b5_cohort.read_out_of_turn(s, [0.0, 0.0, 2.0], 2.0) == 0


def test_the_worker_reads_a_new_user_before_settled_users_not_overdue() -> None:
    """Every new user is read before each settled user that was not overdue when it enrolled."""
    w = workloads.builtin(60, 2)
    enrolled, at = b5_cohort.enrollment(w)
    s = worker([u.changes for u in w.users], 15.0, 30.0, 1, enrolled)
    assert b5_cohort.read_out_of_turn(s, enrolled, at) == 0
    firsts = [t[0] for t, e in zip(s.turns, enrolled, strict=True) if e == at]
    assert len(firsts) == 3 and min(firsts) >= at
    waiting = [
        next(x for x in t if x > at)
        for t, d in zip(s.turns, s.dues, strict=True)
        if t and t[0] < at and any(x > at for x in t) and d[sum(x <= at for x in t) - 1] > at
    ]
    assert waiting and max(firsts) < min(waiting)


def test_accrued_delay_is_the_integral_of_rate_times_wait() -> None:
    """A constant 2 changes an hour over 3 hours accrues 2 x 3^2 / 2 = 9 change-hours."""
    assert accrued_delay([2.0] * 5, 0.0, 3.0) == pytest.approx(9.0)
    # Only the hours with a rate count: 1 an hour in [1, 2), each waiting 1 to 2 h until 3.
    assert accrued_delay([0.0, 1.0, 0.0, 0.0], 0.0, 3.0) == pytest.approx(1.5)


def test_the_oracle_picks_the_largest_accrued_delay_per_cost() -> None:
    """After the sweep, a burst that just began outweighs a slow trickle that began earlier.

    One read an hour. Sweep: A at 0 (arrives 1), B at 2 (arrives 3). At 4: A (1 an hour
    since 1) has accrued 4.5 over an expected cost of 2 - e^-3; B (10 an hour from hour 2,
    read at 3) 5 over 2 - e^-10: 2.31 < 2.50, so B is read.
    """
    rates_a, rates_b = [1.0] * 8, [0.0, 0.0] + [10.0] * 6
    index_a = accrued_delay(rates_a, 1.0, 4.0) / (2 - math.exp(-3.0))
    index_b = accrued_delay(rates_b, 3.0, 4.0) / (2 - math.exp(-10.0))
    assert index_b > index_a
    s = oracle([[], []], [rates_a, rates_b], 1.0, 5.0, **A_DAY)
    assert s.turns == [[1.0], [3.0, 4.0]]


def test_the_oracle_reads_the_busy_user_more_often() -> None:
    """Of two users at 4 and 0.25 changes an hour, the busy one gets most of the reads."""
    hours = 48
    s = oracle([[], []], [[4.0] * hours, [0.25] * hours], 2.0, float(hours), **A_DAY)
    busy, quiet = (len(t) for t in s.turns)
    assert busy > 2 * quiet > 0


def test_the_oracle_keeps_max_interval_for_users_who_never_change() -> None:
    """Idle users have no accrued delay, yet none goes unread longer than `max_interval`."""
    hours, n = 72, 6
    intensity = [[3.0] * hours] + [[0.0] * hours] * (n - 1)
    s = oracle([[]] * n, intensity, 4.0, float(hours), max_interval=10.0, stats_max_age=24.0)
    for turns in s.turns:
        marks = [0.0, *turns, float(hours)]
        assert max(b - a for a, b in itertools.pairwise(marks)) <= 10.0


def test_the_oracle_uses_every_slot() -> None:
    """The oracle reads at every slot: its reads are the budget (within a turn's overrun)."""
    hours = 24
    s = oracle([[1.0], []], [[0.5] * hours] * 2, 3.0, float(hours), **A_DAY)
    assert abs(s.reads - 3 * hours) <= 1


def _poisson_population(seed: int, n: int = 24, days: int = 4) -> Workload:
    """Users at known constant or day-shaped rates, their changes drawn from them."""
    rng = random.Random(seed)
    users = []
    for i in range(n):
        base = rng.choice((0.0, 0.05, 0.2, 1.0, 3.0))
        shape = [base * (2.0 if (h + 3 * i) % 24 < 10 else 0.2) for h in range(24)]
        changes: list[float] = []
        for h in range(24 * days):
            lam, t = shape[h % 24], 0.0
            while lam > 0:
                t += rng.expovariate(lam)
                if t >= 1.0:
                    break
                changes.append(h + t)
        users.append(WorkloadUser(f"u{i}", f"r{base}", tuple(changes), tuple(shape)))
    return Workload(days, tuple(users))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("per_400", [100, 400])
def test_the_oracle_is_never_worse_than_round_robin(seed: int, per_400: int) -> None:
    """With the true intensity known, the oracle's mean delay beats both round robins'."""
    w = _poisson_population(seed)
    per_hour, end = per_400 * len(w.users) / 400, float(w.hours)
    changes = [u.changes for u in w.users]
    intensity = [list(u.intensity or ()) * w.days for u in w.users]
    mean = {
        name: measure(w, s, per_hour)["mean_delay_h"]
        for name, s in {
            "oracle": oracle(changes, intensity, per_hour, end, **A_DAY),
            "round_robin": round_robin(len(changes), per_hour, end),
            "on_change": round_robin_on_change(changes, per_hour, end, 24.0),
        }.items()
    }
    assert mean["oracle"] < min(mean["round_robin"], mean["on_change"])


def test_runs_pool_to_the_mean_of_each_figure_and_the_longest_unread_per_class_too() -> None:
    a, b = (measure(_poisson_population(1, 8, 3), round_robin(8, k, 72.0), k) for k in (5.0, 2.0))
    for c, mine in [("", pooled([a, b])), *pooled([a, b])["classes"].items()]:
        x, y = (r["classes"][c] if c else r for r in (a, b))
        assert mine["longest_unread_h"] == max(x["longest_unread_h"], y["longest_unread_h"])
        assert mine["budget_used"] == pytest.approx((x["budget_used"] + y["budget_used"]) / 2)


def test_told_rates_are_the_true_ones_for_the_day_ahead_by_hour_of_the_day() -> None:
    """At 06:30 on day 1 hour h holds its next occurrence's intensity; an idle hour, a tiny rate."""
    rates = told(TrueRates([[float(h) for h in range(72)]]), 0, None, 30.5).rates()
    assert [round(r * 3600, 6) for r in rates] == [48 + h if h < 6 else 24 + h for h in range(24)]
    assert told(TrueRates([[0.0] * 24]), 0, None, 0.0).rates() == (1e-5 / 3600,) * 24


def test_the_worker_told_the_true_rates_never_reads_a_user_idle_all_day_more_than_its_cap() -> None:
    """Told the truth, the rule reads a user who never changes only as `max_interval` asks."""
    busy = [k / 10 for k in range(1, 480)]
    s = worker([busy, []], 4.0, 48.0, 1, teller=TrueRates([[10.0] * 48, [0.0] * 48]))
    assert len(s.turns[1]) <= 3  # the first sweep's, and one a `max_interval` at most
    assert len(s.turns[0]) > 60


def test_a_length_of_13_to_17_hours_covers_13_or_17_whole_hours_half_as_often_as_14_to_16() -> None:
    """A start placed anywhere: a length L covers floor(L) whole hours, or one more."""
    chance = b5_bayes.waking_model().prior.reshape(24, 5, -1).sum(axis=(0, 2))
    assert chance == pytest.approx([0.125, 0.25, 0.25, 0.25, 0.125], abs=1e-3)


def test_read_hourly_for_a_week_a_user_awake_08_to_22_utc_is_believed_in_its_hours() -> None:
    """12 changes a day within 08-22 UTC: nights believed silent, level within a fifth."""
    rng, learner = random.Random(3), b5_bayes.ModelTold(1, b5_bayes.waking_model())
    before, count = ChangeEstimate(content="0", seen_at=START), 0
    for hour in range(1, 24 * 7):
        count += sum(rng.random() < 12 / 14 / 60 for _ in range(60)) if 8 <= hour % 24 < 22 else 0
        after = ChangeEstimate(content=str(count), seen_at=START + timedelta(hours=hour))
        learner.saw(0, before, after)
        before = after
    hourly = learner.hourly(0)
    assert max(hourly[:7]) < 0.01 * hourly[12] and hourly[22] < 0.01 * hourly[12]
    assert learner.per_day(0) == pytest.approx(12, rel=0.2)
    same_time = ChangeEstimate(content="x", seen_at=before.seen_at)
    learner.saw(0, before, same_time)  # a change in no time: no window explains it
    assert list(learner.hourly(0)) == list(hourly)


def test_builtins_learner_relearns_a_heavy_user_gone_quiet_at_the_move_within_a_day() -> None:
    """A change in each waking hour until the move (day 3), none after: < 3 a day by day 4."""
    learner = b5_bayes.ModelTold(1, b5_bayes.builtin_model(START + timedelta(days=3)))
    before = ChangeEstimate(content="0", seen_at=START)
    for hour in range(1, 24 * 4):
        moved = hour <= 72 and 7 <= hour % 24 < 23
        at = START + timedelta(hours=hour)
        after = ChangeEstimate(content=str(hour) if moved else before.content, seen_at=at)
        learner.saw(0, before, after)
        before = after
        h = learner.hourly(0)  # zone 0 (07-23 UTC) once its first day is read
        assert hour < 24 or (h[3] < 0.01 * h[12] and (hour != 72 or learner.per_day(0) > 20))
    assert learner.per_day(0) < 3
