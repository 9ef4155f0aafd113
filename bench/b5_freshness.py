"""B5 freshness: delay from a change upstream to its arrival, worker schedule vs round robin.

A discrete-event simulation on virtual time (no network, no database): the worker's real
scheduling code decides every turn -- `endpoints_to_call`, `still_wanted` (stats on change),
`decide_turn` (the change estimate and the next due time) and `plan_scale` (the budget's
spread, recomputed every virtual hour as a pass would) -- against the peers' behaviour: a
uniform round robin that reads both endpoints of every user in turn.

The model: users in eight time zones change only in their waking hours (07-23 local), as
a Poisson process; a quarter are idle, most are ordinary (median 4 changes a day), some
heavy (median 30 a day); at the half-way point a share of them change class (idle users
wake up, ordinary ones go quiet, heavy ones calm down and others take their place). Every
change moves both latest-change and stats. The budget is a number of reads an hour, spent
one read per slot at an even pace (what the pacer does); both strategies get the same
slots. A turn's data arrive when its last read is done.

Figures per budget (reads an hour per 400 users): mean and p95 delay over the changes of
days 1-13 (day 0 is the first sweep), the fraction of time a user's copy is stale, the
mean age of stats, and the longest any user went unread; target: the worker's mean delay
<= 0.5 x the round robin's, and nobody unread longer than `poll.max_interval`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import BenchResult, Size, log
from lta_worker.domain import (
    LONG_TERM_SCOPES,
    ChangeEstimate,
    EncryptedToken,
    Outcome,
    PolicyConfig,
    UserRow,
    bucket_rates,
    day_shape,
    decide_turn,
    endpoints_to_call,
    plan_scale,
    still_wanted,
)

HOUR = 3600.0
DAY = 24 * HOUR
START = datetime(2026, 1, 5, tzinfo=UTC)
ZONES = (-8, -5, -3, 0, 1, 3, 5.5, 9)
WAKING = (7, 23)
BUDGETS = (100, 200, 400)  # reads an hour per 400 users
# The worker's settings in this benchmark (docs/config.md recommends them for a small budget).
POLICY = PolicyConfig(
    interval=timedelta(minutes=15),
    schedule="adaptive",
    max_interval=timedelta(hours=24),
    stats="on_change",
    stats_max_age=timedelta(hours=24),
    rate_half_life=timedelta(days=3),
)
TOKEN = EncryptedToken(b"x", "k")
SCOPES = LONG_TERM_SCOPES


@dataclass
class SimUser:
    """One simulated user: its changes upstream and what a strategy has read of it."""

    zone: float
    rates: tuple[float, float]  # changes a day, before and after the shift
    changes: list[float] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)  # arrival times of its turns
    stats_reads: list[float] = field(default_factory=list)


def _population(n: int, days: int, rng: random.Random) -> list[SimUser]:
    users: list[SimUser] = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.25:
            before = 0.0
        elif kind < 0.85:
            before = rng.lognormvariate(math.log(4), 0.7)
        else:
            before = rng.lognormvariate(math.log(30), 0.5)
        shift = rng.random()
        after = before
        if before == 0 and shift < 0.3:
            after = rng.lognormvariate(math.log(4), 0.7)
        elif 0 < before < 15 and shift < 0.15:
            after = 0.0 if shift < 0.08 else rng.lognormvariate(math.log(30), 0.5)
        elif before >= 15 and shift < 0.4:
            after = rng.lognormvariate(math.log(4), 0.7)
        user = SimUser(zone=ZONES[i % len(ZONES)], rates=(before, after))
        user.changes = _changes(user, days, rng)
        users.append(user)
    return users


def _changes(user: SimUser, days: int, rng: random.Random) -> list[float]:
    """Poisson changes, hour by hour, in the user's waking hours only."""
    out: list[float] = []
    awake = WAKING[1] - WAKING[0]
    for hour in range(days * 24):
        local = (hour + user.zone) % 24
        if not WAKING[0] <= local < WAKING[1]:
            continue
        daily = user.rates[0] if hour < days * 12 else user.rates[1]
        lam = daily / awake
        t = 0.0
        while lam > 0:
            t += rng.expovariate(lam)
            if t >= 1.0:
                break
            out.append((hour + t) * HOUR)
    return out


def _latest(user: SimUser, t: float) -> tuple[int, float | None]:
    """How many changes happened by `t`, and the last one's time."""
    k = bisect.bisect_right(user.changes, t)
    return k, (user.changes[k - 1] if k else None)


def _answer(user: SimUser, endpoint: str, t: float) -> Outcome:
    count, last = _latest(user, t)
    if endpoint == "latest-change":
        if last is None:
            return Outcome("none", 404)
        return Outcome("ok", 200, {"changed_at": round(last, 3)})
    return Outcome("ok", 200, {"syncs": count})


def _round_robin(users: list[SimUser], per_hour: float, end: float) -> None:
    """The peers: every user in turn, both endpoints, at the budget's pace."""
    slot = HOUR / per_hour
    t, i = 0.0, 0
    while t + slot < end:
        user = users[i]
        t += slot  # stats, the turn's second read; latest-change was the slot before
        user.reads.append(t - slot)
        user.stats_reads.append(t)
        t += slot
        i = (i + 1) % len(users)


def _worker(users: list[SimUser], per_hour: float, end: float, seed: int) -> int:
    """The worker's scheduling code, one read per slot; returns the slots left unused."""
    rng = random.Random(seed)
    slot = HOUR / per_hour
    rows = [
        UserRow(i, f"u{i}", "active", TOKEN, SCOPES, {}, START, None, START, 0, None, None)
        for i in range(len(users))
    ]
    due: list[tuple[float, int]] = [(0.0, i) for i in range(len(users))]
    heapq.heapify(due)
    cfg, planned_at, t, unused = POLICY, -HOUR, 0.0, 0
    while t < end:
        if t - planned_at >= HOUR:  # a pass's plan: the budget over the estimated rates
            rates = bucket_rates(r.estimate or ChangeEstimate() for r in rows)
            plan = plan_scale(rates, per_hour, POLICY.freshness)
            shape = day_shape(r.estimate or ChangeEstimate() for r in rows)
            cfg = replace(POLICY, plan=replace(plan, shape=shape))
            planned_at = t
        if not due or due[0][0] > t:
            nxt = due[0][0] if due else end
            skipped = max(1, math.ceil((nxt - t) / slot))
            unused += skipped
            t += skipped * slot
            continue
        _, i = heapq.heappop(due)
        row, user = rows[i], users[i]
        now = START + timedelta(seconds=t)
        results: list[tuple[Any, Outcome]] = []
        for endpoint in endpoints_to_call(row, LONG_TERM_SCOPES, now):
            if not still_wanted(row, endpoint, results, now, cfg):
                continue
            results.append((endpoint, _answer(user, endpoint, t)))
            if endpoint == "stats":
                user.stats_reads.append(t)
            t += slot
        user.reads.append(t - slot)
        done = START + timedelta(seconds=t - slot)
        update = decide_turn(row, results, done, cfg, rng)
        assert update.next_due_at is not None
        rows[i] = replace(
            row,
            last_polled_at=update.last_polled_at,
            next_due_at=update.next_due_at,
            estimate=update.estimate,
        )
        heapq.heappush(due, ((update.next_due_at - START).total_seconds(), i))
    return unused


def _measure(users: list[SimUser], end: float) -> dict[str, float]:
    delays: list[float] = []
    stale = 0.0
    gaps = 0.0
    for user in users:
        reads = user.reads
        marks = [0.0, *reads, end]
        gaps = max(gaps, *(b - a for a, b in itertools.pairwise(marks)))
        for c in user.changes:
            k = bisect.bisect_left(reads, c)
            arrival = reads[k] if k < len(reads) else end
            if DAY <= c < end - DAY:
                delays.append(arrival - c)
        # Stale from the first change after a read until the next read.
        for a, b in itertools.pairwise(marks):
            k = bisect.bisect_right(user.changes, a)
            if k < len(user.changes) and user.changes[k] < b:
                stale += max(0.0, b - max(user.changes[k], DAY))
    ages: list[float] = []
    for hour in range(24, int(end / HOUR)):
        t = hour * HOUR
        for user in users:
            k = bisect.bisect_right(user.stats_reads, t)
            ages.append(t - user.stats_reads[k - 1] if k else t)
    delays.sort()
    return {
        "mean_delay_h": sum(delays) / len(delays) / HOUR,
        "p95_delay_h": delays[int(0.95 * (len(delays) - 1))] / HOUR,
        "stale_fraction": stale / (len(users) * (end - DAY)),
        "stats_age_mean_h": sum(ages) / len(ages) / HOUR,
        "longest_unread_h": gaps / HOUR,
        "changes": len(delays),
    }


def run(size: Size) -> BenchResult:
    """Run B5 and return its figures."""
    n, days = {"full": (1000, 14), "quick": (300, 14), "smoke": (40, 3)}[size]
    end = days * DAY
    result = BenchResult("B5", f"freshness: {n} users, {days} days on virtual time")
    population = _population(n, days, random.Random(5))
    cap = POLICY.max_interval.total_seconds() / HOUR
    for budget in BUDGETS:
        per_hour = budget * n / 400
        rr = [replace(u, reads=[], stats_reads=[]) for u in population]
        wk = [replace(u, reads=[], stats_reads=[]) for u in population]
        _round_robin(rr, per_hour, end)
        unused = _worker(wk, per_hour, end, seed=budget)
        base, ours = _measure(rr, end), _measure(wk, end)
        log(f"B5 {budget}/h per 400: round robin {base}, worker {ours}, unused {unused}")
        ratio = ours["mean_delay_h"] / base["mean_delay_h"]
        tag = f"{budget}/h per 400"
        result.add(f"{tag}: mean delay, worker / round robin", ratio, "x", at_most=0.5)
        result.add(f"{tag}: mean delay, round robin", base["mean_delay_h"], "h")
        result.add(f"{tag}: mean delay, worker", ours["mean_delay_h"], "h")
        result.add(f"{tag}: p95 delay, round robin / worker", _pair(base, ours, "p95_delay_h"))
        result.add(f"{tag}: stale share, round robin / worker", _pair(base, ours, "stale_fraction"))
        result.add(f"{tag}: stats age, round robin / worker", _pair(base, ours, "stats_age_mean_h"))
        result.add(
            f"{tag}: longest unread, worker",
            ours["longest_unread_h"],
            "h",
            at_most=cap,
            note=f"poll.max_interval {cap:g} h; round robin {base['longest_unread_h']:.1f} h",
        )
        result.details[tag] = {
            "reads_per_hour": per_hour,
            "round_robin": base,
            "worker": ours,
            "worker_unused_slots": unused,
        }
    result.details["policy"] = {
        "interval": str(POLICY.interval),
        "schedule": POLICY.schedule,
        "max_interval": str(POLICY.max_interval),
        "stats": POLICY.stats,
        "stats_max_age": str(POLICY.stats_max_age),
        "rate_half_life": str(POLICY.rate_half_life),
    }
    return result


def _pair(base: dict[str, float], ours: dict[str, float], key: str) -> str:
    return f"{base[key]:.3g} / {ours[key]:.3g}"
