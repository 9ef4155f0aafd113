"""B5 freshness: delay from a change upstream to its arrival, the worker against yardsticks.

A discrete-event simulation on virtual time in hours (no network, no database): the
worker's real scheduling code decides every turn -- `endpoints_to_call`, `still_wanted`
(stats on change), `decide_turn` (the change estimate and the next due time) and
`plan_scale` / `day_shape` (the budget's spread, recomputed every virtual hour as a pass
would). The same reads an hour go to three yardsticks (`b5_policies`): uniform round robin
reading both endpoints (what the peers do), round robin reading stats only on change, and a
known-rate oracle with the worker's limits; at the judged budgets also the worker's rule told
each user's true rates (`worker(teller=TrueRates(...))`), which splits the gap to the oracle
into the rule's and the estimates', and on `builtin` and `waking` the same rule on the
beliefs of a learner told the population's model (`b5_bayes`): how far estimates from the
bit could go. A read takes one slot at an even pace (what the pacer does); a turn's data
arrive with its last read.

Populations (`workloads`): `builtin`, `waking` (independent changes) and `sessions`
(clustered changes), or a workload file (`bench/run --only B5 --workload FILE`). Figures per
budget (reads an hour per 400 users, scaled to the population): mean and p95 delay over the
changes after day 0 (the first sweep) and before the last day, the longest any user went
unread, the share of the budget used, each also per class of user, and each class's
estimated changes a day against the truth at the end of the run; at the judged budgets the
worker's are the mean of `RUNS` runs a millionth of a slot apart (`worker_runs` keeps each).
Targets (issue 38), at 100 / 200 / 400 reads an hour: the worker's mean delay <= 1.15 x the
known-rate oracle's on independent changes, 1.30 x on `sessions`; no class worse off than
under round robin on change (2 % tolerance); nobody unread longer than `poll.max_interval`;
budget used >= 0.97.
At 800 the worker's mean delay <= round robin on change's (a floor, `poll.interval`, too
high would leave reads unused). New users (`b5_cohort`): at 100 / 200 / 400, 5 % of the
users enrolled half-way through, their time to first read and mean delay over their first
three days against round robin on change's; none read after a settled user not overdue.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import multiprocessing
import os
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import b5_bayes, b5_cohort, workloads
from bench.b5_policies import (
    Schedule,
    oracle,
    round_robin,
    round_robin_on_change,
)
from bench.b5_told import Teller, TrueRates, told
from bench.b5_workload import Workload, classes, hourly_intensity, load
from bench.common import BenchResult, Size, log
from lta_worker.config import PollSettings
from lta_worker.domain import (
    LONG_TERM_SCOPES,
    ChangeEstimate,
    EncryptedToken,
    Outcome,
    UserRow,
    bucket_rates,
    day_shape,
    decide_turn,
    endpoints_to_call,
    next_due,
    plan_scale,
    population_prior,
    still_wanted,
)

START = datetime(2026, 1, 5, tzinfo=UTC)
BUDGETS = (100, 200, 400, 800)  # reads an hour per 400 users
JUDGED = (100, 200, 400)  # against the oracle; 800 judges the floor against round robin
# Mean delay against the known-rate oracle's: independent changes, and clustered (`sessions`).
TARGET_VS_ORACLE = 1.15
TARGETS_VS_ORACLE = {"sessions": 1.30}
CLASS_TOLERANCE = 1.02  # no class's mean delay above this x round robin on change's
MIN_BUDGET_USED = 0.97
# At the judged budgets the worker's figures are the mean of this many runs whose read slots
# differ by a millionth: a small class's mean delay moves by a tenth or more with the path
# the schedule happens to take, the whole population's by half a hundredth (bench/README.md).
RUNS = 3
SLOT_SHIFT = 1e-6
POLICY = PollSettings().policy()  # the worker's defaults
TOKEN = EncryptedToken(b"x", "k")
SCOPES = LONG_TERM_SCOPES
POLICIES = ("worker", "round_robin", "round_robin_on_change", "oracle")
SIZES = {"full": (1000, 14), "quick": (300, 14), "smoke": (40, 3)}


def _hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


def _answer(changes: Sequence[float], endpoint: str, t: float) -> Outcome:
    count = bisect.bisect_right(changes, t)
    if endpoint == "latest-change":
        if not count:
            return Outcome("none", 404)
        return Outcome("ok", 200, {"changed_at": round(changes[count - 1], 6)})
    return Outcome("ok", 200, {"syncs": count})


def worker(
    changes: Sequence[Sequence[float]],
    per_hour: float,
    end: float,
    seed: int,
    enrolled: Sequence[float] | None = None,
    *,
    teller: Teller | None = None,
) -> Schedule:
    """The worker's scheduling code, one read per slot, over the users' changes (hours);
    `Schedule.estimates` holds each user's estimated changes a day at the end. A user
    enrolled at `enrolled[i]` (hours; None: everyone at 0) is due at once then, as
    enrollment sets `next_due_at`, and planned for from the next plan on. With a `teller`
    (`TrueRates`, `b5_bayes.ModelTold`), the plan and every due time take the rates it
    tells instead of the estimates' (the estimates still learn, and seed the population's
    prior): with the true rates, what the schedule's rule gives without having to learn."""
    rng = random.Random(seed)
    n, slot = len(changes), 1.0 / per_hour
    out = Schedule([[] for _ in range(n)], [[] for _ in range(n)], 0, [0] * n)
    out.dues = [[] for _ in range(n)]
    joins = sorted((at, i) for i, at in enumerate(enrolled or [0.0] * n))
    rows = [
        UserRow(i, f"u{i}", "active", TOKEN, SCOPES, {}, START, None, START, 0, None, None)
        for i in range(n)
    ]
    due: list[tuple[float, int]] = []
    cfg, planned_at, t, k = POLICY, -1.0, 0.0, 0
    while t < end:
        while k < n and joins[k][0] <= t:  # enrolled: due at once
            heapq.heappush(due, joins[k])
            k += 1
        if t - planned_at >= 1.0:  # a pass's plan: the budget over the estimated rates
            live = [rows[i] for _, i in joins[:k]]  # the enrolled users
            seen = [
                told(teller, r.id, r.estimate, t) if teller else r.estimate or ChangeEstimate()
                for r in live
            ]
            plan = plan_scale(bucket_rates(seen), per_hour, POLICY.freshness)
            shape = day_shape(seen)
            prior = population_prior(r.estimate for r in live if r.estimate)
            cfg = replace(POLICY, plan=replace(plan, shape=shape, prior=prior))
            planned_at = t
        if not due or due[0][0] > t:
            nxt = min(due[0][0] if due else end, joins[k][0] if k < n else end)
            t += max(1, math.ceil((nxt - t) / slot)) * slot  # slots left unused
            continue
        _, i = heapq.heappop(due)
        row = rows[i]
        now = START + timedelta(hours=t)
        results: list[tuple[Any, Outcome]] = []
        for endpoint in endpoints_to_call(row, LONG_TERM_SCOPES, now):
            if not still_wanted(row, endpoint, results, now, cfg):
                continue
            results.append((endpoint, _answer(changes[i], endpoint, t)))
            if endpoint == "stats":
                out.stats[i].append(t)
            out.reads += 1
            out.per_user_reads[i] += 1
            t += slot
        out.turns[i].append(t - slot)
        at = START + timedelta(hours=t - slot)
        update = decide_turn(row, results, at, cfg, rng)
        due_at = update.next_due_at
        if teller:  # every answer here is `ok` or `none`: its due time is `next_due`'s
            teller.saw(i, row.estimate, update.estimate)
            due_at = next_due(
                told(teller, i, update.estimate, t - slot), at, cfg.plan, cfg.freshness
            )
        assert due_at is not None
        rows[i] = replace(
            row, last_polled_at=update.last_polled_at, next_due_at=due_at, estimate=update.estimate
        )
        out.dues[i].append(_hours(due_at - START))
        heapq.heappush(due, (out.dues[i][-1], i))
    out.estimates = [(r.estimate or ChangeEstimate()).per_day() for r in rows]
    return out


def measure(workload: Workload, schedule: Schedule, per_hour: float) -> dict[str, Any]:
    """Mean and p95 delay, longest unread and budget used, overall and per class."""
    end = float(workload.hours)
    lo, hi = (24.0, end - 24.0) if workload.days >= 3 else (0.0, end)
    delays: dict[str, list[float]] = {c: [] for c in classes(workload.users)}
    gaps = dict.fromkeys(delays, 0.0)
    reads = dict.fromkeys(delays, 0)
    stale, ages = 0.0, []
    for user, turns, stats, count in zip(
        workload.users,
        schedule.turns,
        schedule.stats,
        schedule.per_user_reads,
        strict=True,
    ):
        marks = [0.0, *turns, end]
        gaps[user.cls] = max(gaps[user.cls], *(b - a for a, b in itertools.pairwise(marks)))
        reads[user.cls] += count
        for c in user.changes:
            k = bisect.bisect_left(turns, c)
            if lo <= c < hi:
                delays[user.cls].append((turns[k] if k < len(turns) else end) - c)
        for a, b in itertools.pairwise(marks):  # stale from the first change after a read
            k = bisect.bisect_right(user.changes, a)
            if k < len(user.changes) and user.changes[k] < b:
                stale += max(0.0, min(b, hi) - max(user.changes[k], lo))
        for hour in range(int(lo), int(hi)):
            k = bisect.bisect_right(stats, hour)
            ages.append(hour - stats[k - 1] if k else hour)
    total = max(1, schedule.reads)
    per_class = {
        c: _figures(delays[c], gaps[c], reads[c] / total) for c in delays
    }  # a class's budget_used: its share of the reads made
    overall = _figures(
        [d for ds in delays.values() for d in ds],
        max(gaps.values()),
        schedule.reads / (per_hour * end),
    )
    overall["stale_fraction"] = stale / (len(workload.users) * (hi - lo))
    overall["stats_age_mean_h"] = sum(ages) / max(1, len(ages))
    return {**overall, "classes": per_class}


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One policy's figures (`measure`'s) over several runs: the mean of each, the longest
    unread the longest; per class the same."""

    def merge(figures: Sequence[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in figures[0]:
            values = [f[key] for f in figures]
            if key == "longest_unread_h":
                out[key] = max(values)
            elif key == "changes" or None in values:
                out[key] = values[0]
            else:
                out[key] = sum(values) / len(values)
        return out

    out = merge([{k: v for k, v in r.items() if k != "classes"} for r in runs])
    out["classes"] = {c: merge([r["classes"][c] for r in runs]) for c in runs[0]["classes"]}
    return out


def _class_means(figures: dict[str, Any]) -> dict[str, float | None]:
    return {c: f["mean_delay_h"] for c, f in figures["classes"].items()}


def _figures(delays: list[float], longest: float, used: float) -> dict[str, Any]:
    delays = sorted(delays)
    return {
        "mean_delay_h": sum(delays) / len(delays) if delays else None,
        "p95_delay_h": delays[int(0.95 * (len(delays) - 1))] if delays else None,
        "longest_unread_h": longest,
        "budget_used": used,
        "changes": len(delays),
    }


def compare(
    workload: Workload, budget: int, seed: int, *, model: b5_bayes.Model | None = None
) -> dict[str, Any]:
    """The four policies on one population at one budget (reads an hour per 400 users);
    with the `model` it was drawn from, the learner told it (`b5_bayes`)."""
    per_hour = budget * len(workload.users) / 400
    end = float(workload.hours)
    changes = [u.changes for u in workload.users]
    intensity = [hourly_intensity(workload, u) for u in workload.users]
    cap, age = _hours(POLICY.max_interval), _hours(POLICY.stats_max_age)
    schedules = {
        "worker": worker(changes, per_hour, end, seed),
        "round_robin": round_robin(len(changes), per_hour, end),
        "round_robin_on_change": round_robin_on_change(changes, per_hour, end, age),
        "oracle": oracle(changes, intensity, per_hour, end, max_interval=cap, stats_max_age=age),
    }
    if budget in JUDGED:  # what the estimates cost: the same rule told the true rates
        schedules["worker_known_rates"] = worker(
            changes, per_hour, end, seed, teller=TrueRates(intensity)
        )
    if budget in JUDGED and model:  # how far estimates learned from the bit could go
        learner = b5_bayes.ModelTold(len(changes), model)
        schedules["learner_told_model"] = worker(changes, per_hour, end, seed, teller=learner)
        schedules["learner_told_model"].estimates = [
            learner.per_day(i) for i in range(len(changes))
        ]
    out: dict[str, Any] = {"reads_per_hour": per_hour}
    out.update({name: measure(workload, s, per_hour) for name, s in schedules.items()})
    if budget in JUDGED:  # the same worker on other paths (RUNS)
        runs = [out["worker"]] + [
            measure(workload, worker(changes, per_hour * (1 + k * SLOT_SHIFT), end, seed), per_hour)
            for k in range(1, RUNS)
        ]
        out["worker"] = pooled(runs)
        out["worker_runs"] = [
            {"mean_delay_h": r["mean_delay_h"], "classes": _class_means(r)} for r in runs
        ]
    out["estimates"] = _estimates(workload, intensity, schedules["worker"].estimates, end)
    if "learner_told_model" in schedules:
        learned = schedules["learner_told_model"].estimates
        out["learner_estimates"] = _estimates(workload, intensity, learned, end)
    if budget in JUDGED:
        out["cohort"] = new_users(workload, per_hour, seed)
    return out


def new_users(workload: Workload, per_hour: float, seed: int) -> dict[str, Any]:
    """The cohort enrolled mid-run (`b5_cohort`) under the worker and round robin on change."""
    enrolled, at = b5_cohort.enrollment(workload)
    end = b5_cohort.run_end(workload, at)
    changes = [u.changes for u in workload.users]
    ours = worker(changes, per_hour, end, seed, enrolled)
    age = _hours(POLICY.stats_max_age)
    rrc = round_robin_on_change(changes, per_hour, end, age, enrolled)
    return {
        "enrolled_at_h": at,
        "share": 1 / b5_cohort.COHORT_EVERY,
        "worker": {
            **b5_cohort.figures(workload, ours, enrolled, at, end),
            "read_out_of_turn": b5_cohort.read_out_of_turn(ours, enrolled, at),
        },
        "round_robin_on_change": b5_cohort.figures(workload, rrc, enrolled, at, end),
    }


def _estimates(
    workload: Workload, intensity: list[list[float]], estimated: list[float], end: float
) -> dict[str, dict[str, float]]:
    """Per class, the mean estimated changes a day at the end of the run, and the truth: the
    mean true rate over the last day."""
    out: dict[str, list[tuple[float, float]]] = {}
    last = int(end)
    for user, rates, est in zip(workload.users, intensity, estimated, strict=True):
        true = sum(rates[max(0, last - 24) : last])
        out.setdefault(user.cls, []).append((est, true))
    return {
        c: {
            "estimated_per_day": sum(e for e, _ in v) / len(v),
            "true_per_day": sum(t for _, t in v) / len(v),
        }
        for c, v in out.items()
    }


def run(size: Size, workload_file: Path | None = None) -> BenchResult:
    """Run B5 on the built-in populations (or on a workload file) and return its figures."""
    n, days = SIZES[size]
    if workload_file is None:
        populations = {kind: make(n, days) for kind, make in workloads.KINDS.items()}
    else:
        populations = {workload_file.stem: load(workload_file)}
    names = ", ".join(f"{k} ({len(w.users)} users, {w.days} days)" for k, w in populations.items())
    result = BenchResult("B5", f"freshness on virtual time: {names}")
    cap = _hours(POLICY.max_interval)
    sections: dict[str, Any] = {}
    # Each population at each budget is a job for a pool of one process per core: the
    # simulation is seeded, so its figures do not depend on how the jobs share the machine.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=spawn) as pool:
        models = {
            name: None if workload_file else _model(name, w) for name, w in populations.items()
        }
        runs = {
            (name, budget): pool.submit(compare, w, budget, budget, model=models[name])
            for name, w in populations.items()
            for budget in BUDGETS
        }
    for name, workload in populations.items():
        budgets: dict[str, Any] = {}
        for budget in BUDGETS:
            figures = runs[name, budget].result()
            budgets[str(budget)] = figures
            log(f"B5 {name} {budget}/h per 400: " + _summary(figures))
            _add_figures(result, name, budget, figures, cap)
        result.details.setdefault("estimates", {})[name] = budgets[str(JUDGED[0])]["estimates"]
        sections[name] = {"users": len(workload.users), "days": workload.days, "budgets": budgets}
    result.extra["workloads"] = sections
    result.details["policy"] = {
        "interval": str(POLICY.interval),
        "schedule": POLICY.schedule,
        "max_interval": str(POLICY.max_interval),
        "stats": POLICY.stats,
        "stats_max_age": str(POLICY.stats_max_age),
        "rate_half_life": str(POLICY.rate_half_life),
    }
    return result


def _model(name: str, workload: Workload) -> b5_bayes.Model | None:
    """The model a built-in population was drawn from (`b5_bayes`), if B5 can tell it."""
    if name == "waking":
        return b5_bayes.waking_model()
    if name == "builtin":  # rates move half-way through the run
        return b5_bayes.builtin_model(START + timedelta(hours=workload.days * 12))
    return None


def _summary(figures: dict[str, Any]) -> str:
    return ", ".join(
        f"{p} {_h(figures[p]['mean_delay_h'])} h (p95 {_h(figures[p]['p95_delay_h'], '.2f')}, "
        f"longest {figures[p]['longest_unread_h']:.1f} h, used {figures[p]['budget_used']:.3f})"
        for p in POLICIES
    )


def _h(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when a population has no change to measure (a file may have none)."""
    return None if a is None or not b else a / b


def _add_figures(
    result: BenchResult, name: str, budget: int, figures: dict[str, Any], cap: float
) -> None:
    # The built-in population keeps its figures' names (the README and the smoke test use them).
    tag = f"{budget}/h per 400" if name == "builtin" else f"{name}: {budget}/h per 400"
    mean = {p: figures[p]["mean_delay_h"] for p in POLICIES}
    wk, rrc = figures["worker"], figures["round_robin_on_change"]
    worst, ratio = _worst_class(wk["classes"], rrc["classes"])
    judged = budget in JUDGED
    result.add(  # beyond JUDGED: whether the floor (`poll.interval`) leaves reads unused
        f"{tag}: mean delay, worker / round robin on change",
        _ratio(mean["worker"], mean["round_robin_on_change"]),
        "x",
        at_most=None if judged else 1.0,
    )
    runs = figures.get("worker_runs", [])
    result.add(
        f"{tag}: worst class, worker / round robin on change",
        ratio,
        "x",
        at_most=CLASS_TOLERANCE if judged else None,
        note=_spread(
            f"class {worst}",
            [r["classes"].get(worst) for r in runs],
            rrc["classes"].get(worst, {}).get("mean_delay_h"),
        ),
    )
    if not judged:
        return
    result.add(
        f"{tag}: mean delay, worker / round robin",
        _ratio(mean["worker"], mean["round_robin"]),
        "x",
    )
    result.add(f"{tag}: mean delay, round robin", mean["round_robin"], "h")
    result.add(f"{tag}: mean delay, worker", mean["worker"], "h")
    result.add(
        f"{tag}: mean delay, worker / oracle",
        _ratio(mean["worker"], mean["oracle"]),
        "x",
        at_most=TARGETS_VS_ORACLE.get(name, TARGET_VS_ORACLE),
        note=_spread(
            f"oracle {_h(mean['oracle'])} h, "
            f"{_h(_ratio(mean['oracle'], mean['round_robin']))} x RR; RR on change "
            f"{_h(_ratio(mean['round_robin_on_change'], mean['round_robin']))} x RR",
            [r["mean_delay_h"] for r in runs],
            mean["oracle"],
        ),
    )
    known = figures["worker_known_rates"]
    result.add(  # information: the rule's own loss; the rest of the ratio is the estimates'
        f"{tag}: mean delay, worker told the true rates / oracle",
        _ratio(known["mean_delay_h"], mean["oracle"]),
        "x",
        note=f"budget used {known['budget_used']:.3f}",
    )
    learner = figures.get("learner_told_model")
    if learner:  # information: how far estimates learned from the bit could go (b5_bayes)
        result.add(
            f"{tag}: mean delay, learner told the population's model / oracle",
            _ratio(learner["mean_delay_h"], mean["oracle"]),
            "x",
            note=f"the worker's rule on its beliefs; worker / it "
            f"{_h(_ratio(mean['worker'], learner['mean_delay_h']))}",
        )
    result.add(
        f"{tag}: p95 delay, RR / RR on change / worker / oracle",
        " / ".join(
            _h(figures[p]["p95_delay_h"], ".3g")
            for p in ("round_robin", "round_robin_on_change", "worker", "oracle")
        ),
        "h",
    )
    result.add(
        f"{tag}: longest unread, worker",
        wk["longest_unread_h"],
        "h",
        at_most=cap,
        note=f"poll.max_interval {cap:g} h; oracle {figures['oracle']['longest_unread_h']:.1f} h",
    )
    result.add(f"{tag}: budget used, worker", wk["budget_used"], at_least=MIN_BUDGET_USED)
    _add_cohort(result, tag, figures.get("cohort"))


def _add_cohort(result: BenchResult, tag: str, cohort: dict[str, Any] | None) -> None:
    if not cohort or not cohort["worker"]["users"]:
        return
    ours, rrc = cohort["worker"], cohort["round_robin_on_change"]
    result.add(
        f"{tag}: new users, time to first read, worker / RR on change",
        f"{_h(ours['first_read_mean_h'])} / {_h(rrc['first_read_mean_h'])}",
        "h",
        note=f"{ours['users']} users enrolled at day {cohort['enrolled_at_h'] / 24:g}; longest "
        f"{_h(ours['first_read_max_h'])} / {_h(rrc['first_read_max_h'])} h",
    )
    result.add(
        f"{tag}: new users' mean delay over their first {b5_cohort.FIRST_DAYS} days, "
        "worker / RR on change",
        _ratio(ours["mean_delay_h"], rrc["mean_delay_h"]),
        "x",
        note=f"{_h(ours['mean_delay_h'])} / {_h(rrc['mean_delay_h'])} h",
    )
    result.add(
        f"{tag}: new users read after settled users not overdue, worker",
        ours["read_out_of_turn"],
        at_most=0,
    )


def _spread(what: str, values: Sequence[float | None], base: float | None) -> str:
    """`what`, and the worker's runs' range (RUNS), each over `base`."""
    ratios = [r for r in (_ratio(v, base) for v in values) if r is not None]
    if len(ratios) < 2:
        return what
    return f"{what}; the mean of {len(ratios)} runs, {min(ratios):.3f}-{max(ratios):.3f}"


def _worst_class(ours: dict[str, Any], base: dict[str, Any]) -> tuple[str, float | None]:
    """The class whose mean delay is worst against the base's, and by how much."""
    ratios = {
        c: f["mean_delay_h"] / base[c]["mean_delay_h"]
        for c, f in ours.items()
        if f["mean_delay_h"] is not None and base[c]["mean_delay_h"]
    }
    if not ratios:
        return "-", None
    worst = max(ratios, key=lambda c: ratios[c])
    return worst, ratios[worst]
