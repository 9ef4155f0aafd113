"""What `status`, `check` and `/healthz` report, with the health verdict (docs/operations.md,
"Metrics and health"); the JSON shapes of a user and a result; the freshness and capacity
plans (their arithmetic is `domain`'s)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from lta_worker.domain import (
    RECHECKED_STATES,
    TRIP_HINTS,
    USER_STATES,
    BudgetSeen,
    CapacityPlan,
    PolicyConfig,
    SchedulePlan,
    class_intervals,
    day_shape,
    expected_delay,
    from_buckets,
    per_hour,
    plan_capacity,
    plan_scale,
    population_prior,
)

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.domain import InstanceRow, PassRecord, ResultRow, UserForgotten, UserRow
    from lta_worker.storage import Store


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a `Z`, or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def user_json(row: UserRow) -> dict[str, Any]:
    """One user as `users list --format json` shows it (never the token)."""
    return {
        "user": row.user,
        "state": row.state,
        "has_token": row.token is not None,
        "scopes": list(row.scopes),
        "enrolled_at": iso(row.enrolled_at),
        "last_polled_at": iso(row.last_polled_at),
        "next_due_at": iso(row.next_due_at),
        "consecutive_failures": row.consecutive_failures,
        "last_outcome": row.last_outcome,
        "last_code": row.last_code,
        "denied": {endpoint: iso(when) for endpoint, when in sorted(row.denied.items())},
    }


def result_json(row: ResultRow | UserForgotten) -> dict[str, Any]:
    """One exported result (a line of `results export`), or a forgotten user's feed line."""
    from lta_worker.domain import UserForgotten  # loaded already: the row is one of its

    if isinstance(row, UserForgotten):
        return {"user": row.user, "forgotten": True, "reason": row.reason, "at": iso(row.at)}
    return {
        "user": row.user,
        "endpoint": row.endpoint,
        "status": row.status,
        "payload": row.payload,
        "fetched_at": iso(row.fetched_at),
        "changed_at": iso(row.changed_at),
        "state": row.state,
    }


def _json(record: PassRecord | BudgetSeen | InstanceRow | None) -> dict[str, Any] | None:
    """A record's fields as JSON-able data, in their order, times by `iso`."""
    if record is None:
        return None
    return {k: iso(v) if isinstance(v, datetime) else v for k, v in asdict(record).items()}


def collect_status(
    settings: Settings,
    now: datetime | None = None,
    *,
    store: Store | None = None,
    problems: Iterable[str] = (),
) -> dict[str, Any]:
    """Everything `status` shows, as plain JSON-able data, with the health verdict.

    Without `store` (`serve`'s, for `/healthz`) the database is opened read-only and closed
    again; `problems` (known beyond the database) are added to the verdict.

    Raises:
        SchemaOutdatedError: no schema or an older one; NoDatabaseError: no SQLite file
            (exit 78: `db upgrade`).
        StorageError: the database cannot be reached (exit 75).
    """
    from lta_worker import __version__
    from lta_worker.domain import USER_STATES
    from lta_worker.runtime import Runtime, instance_ttl

    runtime = Runtime(settings, read_only=True)
    now = now or runtime.clock.now()
    db = runtime.store if store is None else store
    try:
        counts = db.count_by_state()
        due = db.count_due(now)
        last = db.last_pass()
        success = last if last is not None and last.answered else None
        success = success or db.last_pass(answered=True)
        last_reads = last if last is not None and last.reads else db.last_pass(read=True)
        reads = db.read_health()
        first = None if success is not None else db.last_pass(first=True)
        budget = db.budget_seen(settings.client.id)
        instances = db.live_instances(now, instance_ttl(settings))
        plan = capacity_plan(settings, counts, budget)
        schedule = schedule_summary(db, settings, counts, plan)
        outbox = db.outbox_counts()
    finally:
        runtime.close()
    data: dict[str, Any] = {
        "generated_at": iso(now),
        "version": __version__,
        "users": {state: counts.get(state, 0) for state in USER_STATES},
        "due": due,
        "last_pass": _json(last),
        "last_success": _json(success),
        "last_reads": _json(last_reads),
        "reads": {
            "last_answered_at": iso(reads.last_answered_at),
            "failing": reads.failing,
        },
        "budget": _json(budget),
        "capacity": {
            "reads_needed_per_hour": round(plan.reads_needed_per_hour, 1),
            "available_per_hour": round(plan.available_per_hour, 1),
            "budget_known": plan.budget_known,
            "configured_interval_s": plan.configured_interval.total_seconds(),
            "effective_interval_s": round(plan.effective_interval.total_seconds()),
            "sustainable": plan.sustainable,
            "warning": plan.warning,
        },
        "schedule": schedule,
        "webhooks": {
            "enabled": settings.webhook.url is not None,
            "backlog": outbox.backlog,
            "dead_letter": outbox.dead,
            "oldest_backlog_at": iso(outbox.oldest_at),
        },
        "instances": [_json(instance) for instance in instances],
    }
    found = assess_health(
        data,
        now=now,
        interval=settings.poll.interval,
        first_pass_at=first.finished_at if first is not None else None,
        failing_after=settings.poll.breaker_threshold,
    )
    found.extend(problems)
    data["healthy"] = not found
    data["problems"] = found
    return data


def assess_health(
    data: dict[str, Any],
    *,
    now: datetime,
    interval: timedelta,
    first_pass_at: datetime | None = None,
    failing_after: int,
) -> list[str]:
    """The problems in `collect_status`'s data (empty: healthy); pure, takes `now`.

    The one verdict of `status --check`, `status --format json` and `/healthz`.
    Problems: users due and no answered read for twice `interval` (after `first_pass_at`,
    a new installation's grace); `failing_after` users (or every active one) whose last
    read failed after the last answered one.
    """
    problems: list[str] = []
    reads = data.get("reads") or {}
    users = data.get("users", {})
    failing = reads.get("failing", 0)
    success = data.get("last_success")
    # The later of the users' latest answered read and the last pass that had one: a user
    # answered then failed later still counts, and pass summaries are kept only so long.
    known = [reads.get("last_answered_at"), (success or {}).get("finished_at")]
    answered = max((a for a in known if a), key=datetime.fromisoformat, default=None)
    if failing and failing >= max(1, min(failing_after, users.get("active", 0))):
        problems.append(
            f"reads are failing: the last read of {failing} user(s) failed (5xx, network or "
            f"broken answer) and no read was answered since {answered or 'ever'}; "
            "see the poll.read events"
        )
    stale_after = 2 * interval
    due = data.get("due", 0)
    if due and answered is not None:
        if now - datetime.fromisoformat(answered) > stale_after:
            problems.append(
                f"no read answered since {answered} (more than twice poll.interval) while "
                f"{due} user(s) are due"
            )
    elif due and first_pass_at is not None and now - first_pass_at > stale_after:
        problems.append(
            f"no read has been answered yet (passes ran for more than twice poll.interval) "
            f"while {due} user(s) are due"
        )
    # The last pass that made reads too: passes that found nobody due do not hide a breaker.
    for stop in (data.get("last_pass"), data.get("last_reads")):
        if stop and stop["stopped"] in {"breaker", "config"}:
            # A breaker pass's plain 401s (held, never written) say which cause tripped it.
            rejected = (stop.get("counts") or {}).get("rejected")
            hint = TRIP_HINTS["plain_401" if rejected else "http_404"]
            why = f": {hint}" if stop["stopped"] == "breaker" else ""
            problems.append(
                f"the last pass stopped at {stop['finished_at']}: {stop['stopped']} "
                f"(exit {stop['exit_code']}){why}; see the pass.breaker_tripped or error event"
            )
            break
    warning = data.get("capacity", {}).get("warning")
    if warning:
        problems.append(f"capacity: {warning}")
    rejected = users.get("rejected", 0)
    if rejected:
        problems.append(f"{rejected} user(s) rejected (plain 401 while others succeed)")
    return problems


REPLAN: Final = timedelta(minutes=10)
"""How long a plan is used before the users are scanned again (estimates move slowly)."""
MOVED: Final = 2.0
"""How many times larger or smaller a reported budget remakes the plan before `REPLAN`."""


def _per_hour(seen: BudgetSeen | None) -> float | None:
    """The reads an hour a report allows, or None without a reported limit."""
    if seen is None or seen.limit is None:
        return None
    return per_hour(seen.limit, seen.window_seconds)


def budget_moved(planned: BudgetSeen | None, seen: BudgetSeen | None) -> bool:
    """Whether a plan from `planned` is stale once `seen`: a limit new, or `MOVED` times off."""
    before, now = _per_hour(planned), _per_hour(seen)
    if now is None:
        return False
    if before is None:
        return True
    return now >= before * MOVED or now * MOVED <= before


def capacity_plan(
    settings: Settings, counts: Mapping[str, int], seen: BudgetSeen | None
) -> CapacityPlan:
    """The capacity plan for these users (per state) and the budget last seen."""
    adaptive = settings.poll.schedule == "adaptive"
    return plan_capacity(
        users_by_state=counts,
        reads_per_active_user=len(settings.client.scopes),
        # The adaptive schedule spreads the budget by change rate and promises only
        # `max_interval`: the budget must cover that, not every user each `interval`.
        interval=settings.poll.policy().max_interval if adaptive else settings.poll.interval,
        interval_key="poll.max_interval" if adaptive else "poll.interval",
        parked_interval=settings.poll.parked_interval,
        reserve=settings.ratelimit.reserve,
        budget_limit=seen.limit if seen else None,
        budget_window_seconds=seen.window_seconds if seen else None,
        fallback_per_hour=settings.ratelimit.fallback_per_hour,
    )


def for_active(capacity: CapacityPlan) -> float:
    """Reads an hour the active users may spend: the budget less the re-checks."""
    return max(capacity.available_per_hour - capacity.rechecks_per_hour, 0.0)


def schedule_summary(
    store: Store, settings: Settings, counts: Mapping[str, int], capacity: CapacityPlan
) -> dict[str, Any]:
    """What `status` shows of the schedule: per class of user, count, interval and mean delay."""
    poll = settings.poll
    policy = poll.policy()
    rates = from_buckets(store.rate_buckets())
    if policy.schedule == "adaptive":
        budget = for_active(capacity)
        plan = plan_scale(rates, budget, policy.freshness)
        classes = [
            _user_class(name, users, seconds, delay)
            for name, users, seconds, delay in class_intervals(rates, plan, policy.freshness)
        ]
        mean_delay = expected_delay(rates, plan, policy.freshness)
    else:
        budget, plan = None, SchedulePlan()
        active = int(sum(weight for _, _, weight in rates))
        every = round(poll.interval.total_seconds())
        # Fixed: a change waits half the interval on average.
        classes = [_user_class("active", active, every, every / 2)]
        mean_delay = every / 2 if active else None
    # One class per re-checked state, each its own users (not all under `parked`), with no
    # delay: re-checked for access, not read for changes.
    parked = poll.parked_interval.total_seconds()
    classes += [
        _user_class(state, counts.get(state, 0), parked, None)
        for state in USER_STATES
        if state in RECHECKED_STATES
    ]
    return {
        "mode": policy.schedule,
        "stats": policy.stats,
        "budget_per_hour": None if budget is None else round(budget, 1),
        "max_interval_s": round(poll.max_interval.total_seconds()),
        "expected_delay_s": None if mean_delay is None else round(mean_delay),
        "classes": classes,
    }


def _user_class(
    name: str, users: float, interval_s: float, delay_s: float | None
) -> dict[str, Any]:
    return {
        "class": name,
        "users": int(users),
        "interval_s": round(interval_s),
        "expected_delay_s": None if delay_s is None else round(delay_s),
    }


class PlanCache:
    """The last plan, when and from which budget it was made (renewed every `REPLAN`)."""

    def __init__(self) -> None:
        self.plan: SchedulePlan | None = None
        self.made_at: datetime | None = None
        self.seen: BudgetSeen | None = None  # the budget the plan was made from

    def get(
        self,
        store: Store,
        settings: Settings,
        policy: PolicyConfig,
        now: datetime,
        seen: BudgetSeen | None = None,
    ) -> SchedulePlan:
        """The cached plan while younger than `REPLAN` and its budget holds, else a new one."""
        if policy.schedule != "adaptive":
            return SchedulePlan()
        if seen is None:
            seen = store.budget_seen(settings.client.id)
        if (
            self.plan is None
            or self.made_at is None
            or now - self.made_at >= REPLAN
            or budget_moved(self.seen, seen)
        ):
            self.plan, self.made_at = plan_for_pass(store, settings, policy, seen), now
            self.seen = seen
        return self.plan


def plan_for_pass(
    store: Store, settings: Settings, policy: PolicyConfig, seen: BudgetSeen | None
) -> SchedulePlan:
    """The plan the pass schedules with (empty under `poll.schedule = "fixed"`)."""
    if policy.schedule != "adaptive":
        return SchedulePlan()
    budget = for_active(capacity_plan(settings, store.count_by_state(), seen))
    rates = from_buckets(store.rate_buckets())
    plan = plan_scale(rates, budget, policy.freshness)
    sample = store.sample_estimates()
    return SchedulePlan(
        plan.scale,
        plan.budget_per_hour,
        day_shape(sample),
        expected_delay(rates, plan, policy.freshness),
        population_prior(sample),
    )
