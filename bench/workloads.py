"""B5's built-in populations, and `--write FILE` to save one as a workload file.

- `builtin`: users in eight time zones who change only in their waking hours (07-23 local),
  as Poisson processes; a quarter idle, 60 % ordinary (median 4 changes a day), 15 % heavy
  (median 30 a day); half-way through a share change class (idle users wake up, ordinary
  ones go quiet or heavy, heavy ones calm down). B5's population since it was written.
- `sessions`: a population of another kind. Changes come in sessions (a burst of a few
  changes minutes apart), not one by one; each user has a waking window of its own (start
  06-10 local, 13-17 hours long) in one of 22 time zones; some users sleep for days and
  then wake, others change their pace on a day of their own (four times more or less),
  and a tenth never change.
- `waking`: independent (Poisson) changes in each user's own waking hours (starting 06-10
  local, 13-17 hours long) in one of 24 time zones, at a steady pace of its class: a fifth
  idle, `light` (median 1 a day), `ordinary` (4 a day) and `busy` (12 a day).

All are seeded and deterministic, and carry each user's true hourly change intensity.
`--night SHARE` adds to every user changes in the hours it is asleep, at SHARE of its
waking rate: the users the schedule's quiet nights bet against (bench/README.md, B5).

    python -m bench.workloads --write FILE [--kind sessions] [--users N] [--days D] [--seed S]
                              [--night SHARE]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

from bench.b5_workload import Workload, WorkloadUser, dumps, hourly_intensity

ZONES = (-8, -5, -3, 0, 1, 3, 5.5, 9)
WAKING = (7, 23)
# `builtin`'s classes: (median changes a day, sigma of its log); a share of the users idle
# and ordinary (the rest heavy), ordinary from HEAVY_FROM a day up classed as heavy; and the
# chances, half-way through, that idle users wake, ordinary ones go quiet or heavy, heavy
# ones calm down (b5_bayes tells its learner all of these).
ORDINARY, HEAVY = (4.0, 0.7), (30.0, 0.5)
IDLE_SHARE, ORDINARY_SHARE = 0.25, 0.6
HEAVY_FROM = 15.0
WAKE, QUIET, BUSIER, CALM = 0.3, 0.08, 0.07, 0.4


def builtin(n: int, days: int, seed: int = 5) -> Workload:
    """B5's own population (the draws are those of B5 before workload files existed)."""
    rng = random.Random(seed)
    users: list[WorkloadUser] = []
    for i in range(n):
        kind = rng.random()
        if kind < IDLE_SHARE:
            before = 0.0
        elif kind < IDLE_SHARE + ORDINARY_SHARE:
            before = rng.lognormvariate(math.log(ORDINARY[0]), ORDINARY[1])
        else:
            before = rng.lognormvariate(math.log(HEAVY[0]), HEAVY[1])
        shift = rng.random()
        after = before
        if before == 0 and shift < WAKE:
            after = rng.lognormvariate(math.log(ORDINARY[0]), ORDINARY[1])
        elif 0 < before < HEAVY_FROM and shift < QUIET + BUSIER:
            after = 0.0 if shift < QUIET else rng.lognormvariate(math.log(HEAVY[0]), HEAVY[1])
        elif before >= HEAVY_FROM and shift < CALM:
            after = rng.lognormvariate(math.log(ORDINARY[0]), ORDINARY[1])
        zone = ZONES[i % len(ZONES)]
        intensity = _waking_intensity(zone, (before, after), days)
        changes = _poisson(intensity, rng)
        cls = _kind(before) if _kind(before) == _kind(after) else f"{_kind(before)}>{_kind(after)}"
        users.append(WorkloadUser(f"u{i}", cls, tuple(changes), tuple(intensity)))
    return Workload(days, tuple(users))


def _kind(daily: float) -> str:
    return "idle" if daily == 0 else "heavy" if daily >= HEAVY_FROM else "ordinary"


def _waking_intensity(zone: float, rates: tuple[float, float], days: int) -> list[float]:
    """Changes an hour, hour by hour: the day's rate spread over the waking hours."""
    out: list[float] = []
    awake = WAKING[1] - WAKING[0]
    for hour in range(days * 24):
        local = (hour + zone) % 24
        daily = rates[0] if hour < days * 12 else rates[1]
        out.append(daily / awake if WAKING[0] <= local < WAKING[1] else 0.0)
    return out


def _poisson(intensity: list[float], rng: random.Random) -> list[float]:
    """Poisson changes, hour by hour, at the given rate (the draws B5 always made)."""
    out: list[float] = []
    for hour, lam in enumerate(intensity):
        t = 0.0
        while lam > 0:
            t += rng.expovariate(lam)
            if t >= 1.0:
                break
            out.append(hour + t)
    return out


# Sessions: mean changes per session and the minutes between a session's changes.
BURST_MEAN = {"bursty": 5.0, "steady": 2.0, "sleeper": 2.5, "shifting": 3.0}
SESSIONS_AN_HOUR = {"bursty": 0.3, "steady": 0.15, "sleeper": 0.15, "shifting": 0.15}
GAP_MINUTES = 6.0


def sessions(n: int, days: int, seed: int = 29) -> Workload:
    """A population in sessions, with waking windows by time zone, sleepers and shifts."""
    rng = random.Random(seed)
    users: list[WorkloadUser] = []
    end = days * 24
    for i in range(n):
        r = rng.random()
        kind = (
            "idle"
            if r < 0.10
            else "sleeper"
            if r < 0.30
            else "shifting"
            if r < 0.50
            else "bursty"
            if r < 0.70
            else "steady"
        )
        zone = rng.randrange(-10, 12)
        start, length = rng.uniform(6, 10), rng.uniform(13, 17)
        rate = 0.0 if kind == "idle" else SESSIONS_AN_HOUR[kind] * rng.lognormvariate(0, 0.5)
        burst = BURST_MEAN.get(kind, 1.0)
        pivot = rng.randint(1, max(1, days - 2)) * 24  # sleepers wake, shifters shift, then
        factor = rng.choice((0.25, 4.0))
        sessions_at: list[float] = []
        for hour in range(end):
            s = rate if (hour + zone - start) % 24 < length else 0.0
            if kind == "sleeper" and hour < pivot:
                s = 0.0
            if kind == "shifting" and hour >= pivot:
                s *= factor
            sessions_at.append(s)
        changes: list[float] = []
        for begin in _poisson(sessions_at, rng):
            t, count = begin, 1 + _geometric(burst - 1, rng)
            for _ in range(count):
                if t >= end:
                    break
                changes.append(t)
                t += rng.expovariate(60 / GAP_MINUTES)
        intensity = tuple(s * burst for s in sessions_at)
        users.append(WorkloadUser(f"s{i}", kind, tuple(sorted(changes)), intensity))
    return Workload(days, tuple(users))


# Waking: each class's share of the users and median changes a day, the spread of a user's
# rate about its class's median (sigma of its log), and the ranges its waking hours' local
# start and length are drawn from (b5_bayes tells its learner the classes, the spread and
# the lengths; the zones make the start any hour).
WAKING_CLASSES = (
    ("idle", 0.2, 0.0),
    ("light", 0.3, 1.0),
    ("ordinary", 0.3, 4.0),
    ("busy", 0.2, 12.0),
)
WAKING_SPREAD = 0.5
WAKING_START = (6.0, 10.0)
WAKING_LENGTH = (13.0, 17.0)


def waking(n: int, days: int, seed: int = 38) -> Workload:
    """Independent changes in each user's own waking hours, at a steady pace per class."""
    rng = random.Random(seed)
    users: list[WorkloadUser] = []
    for i in range(n):
        r, at = rng.random(), 0.0
        cls, median = WAKING_CLASSES[-1][0], WAKING_CLASSES[-1][2]
        for name, share, rate in WAKING_CLASSES:
            at += share
            if r < at:
                cls, median = name, rate
                break
        daily = median and rng.lognormvariate(math.log(median), WAKING_SPREAD)
        zone = rng.randrange(-11, 13)
        start, length = rng.uniform(*WAKING_START), rng.uniform(*WAKING_LENGTH)
        hourly = [
            daily / length if (h + zone - start) % 24 < length else 0.0 for h in range(24 * days)
        ]
        users.append(WorkloadUser(f"w{i}", cls, tuple(_poisson(hourly, rng)), tuple(hourly)))
    return Workload(days, tuple(users))


def _geometric(mean: float, rng: random.Random) -> int:
    """A count >= 0 with the given mean (geometric)."""
    if mean <= 0:
        return 0
    p = 1 / (1 + mean)
    return int(math.log(1 - rng.random()) / math.log(1 - p))


def with_nights(workload: Workload, share: float, seed: int = 7) -> Workload:
    """`workload` with Poisson changes added in each user's quiet hours, at `share` of its
    busiest hour's rate (its intensity says so too); idle users stay idle. Made for `waking`,
    whose users keep one pace: a user that sleeps for days or changes class (`sessions`'
    sleepers, `builtin`) gets them in every quiet hour of the run, its idle days too."""
    rng = random.Random(seed)
    users = []
    for user in workload.users:
        rates = hourly_intensity(workload, user)
        extra = [share * max(rates) if r == 0 else 0.0 for r in rates]
        changes = tuple(sorted((*user.changes, *_poisson(extra, rng))))
        total = tuple(r + e for r, e in zip(rates, extra, strict=True))
        users.append(WorkloadUser(user.user, user.cls, changes, total))
    return Workload(workload.days, tuple(users))


KINDS: dict[str, Callable[..., Workload]] = {
    "builtin": builtin,
    "waking": waking,
    "sessions": sessions,
}


def main(argv: list[str]) -> int:
    """Write a generated population as a workload file."""
    parser = argparse.ArgumentParser(prog="python -m bench.workloads", description=__doc__)
    parser.add_argument("--write", type=Path, required=True, help="the JSON Lines file to write")
    parser.add_argument("--kind", choices=sorted(KINDS), default="sessions")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--seed", type=int, help="the generator's seed (default: the built-in)")
    parser.add_argument(
        "--night", type=float, default=0.0, help="changes in quiet hours, as a share of waking"
    )
    args = parser.parse_args(argv)
    make = KINDS[args.kind]
    workload = make(args.users, args.days) if args.seed is None else _seeded(args)
    if args.night > 0:
        workload = with_nights(workload, args.night)
    args.write.write_text(dumps(workload), encoding="utf-8")
    print(f"{args.write}: {len(workload.users)} users, {workload.days} days ({args.kind})")
    return 0


def _seeded(args: argparse.Namespace) -> Workload:
    return KINDS[args.kind](args.users, args.days, args.seed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
