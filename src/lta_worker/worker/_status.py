"""What `status`, `check` and `/healthz` report: users per state, passes, budget, capacity,
and a health verdict.

`collect_status` reads the database read-only (`open_store_readonly`: it never creates or
migrates it). `assess_health` is pure: it turns the collected data and `now` into
`healthy` and a list of `problems`, each one line saying what is wrong:

- no pass completed (`stopped` = `completed`) within twice `poll.interval` (a fresh install
  has a grace of the same length from its first pass);
- the last pass stopped at the circuit breaker or on a configuration error (exit 78);
- the budget cannot read every user each `poll.interval` (the capacity warning);
- users are `rejected` (a plain 401 for them while others succeed).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.domain import PassRecord
    from lta_worker.storage import Store


def iso(value: datetime | None) -> str | None:
    """ISO 8601 with a `Z`, or None."""
    return value.isoformat().replace("+00:00", "Z") if value else None


def _pass_json(last: PassRecord | None) -> dict[str, Any] | None:
    if last is None:
        return None
    return {
        "instance": last.instance,
        "started_at": iso(last.started_at),
        "finished_at": iso(last.finished_at),
        "stopped": last.stopped,
        "exit_code": last.exit_code,
        "reads": last.reads,
        "throttled": last.throttled,
        "counts": dict(last.counts),
    }


def collect_status(
    settings: Settings, now: datetime | None = None, *, store: Store | None = None
) -> dict[str, Any]:
    """Everything `status` shows, as plain JSON-able data, with the health verdict.

    Args:
        settings: the settings in force (the database, the interval, the reserve).
        now: the time to count due users at; the system clock by default (the demo, whose
            clock is moved by hand, passes its own).
        store: an open store to read (`serve`'s own, for `/healthz`); by default the
            database is opened read-only and closed again.

    Raises:
        SchemaOutdatedError: no database or an older schema (exit 78: `db upgrade`).
        StorageError: the database cannot be reached (exit 75).
    """
    from lta_worker import __version__
    from lta_worker.domain import USER_STATES, plan_capacity
    from lta_worker.worker._clock import SystemClock
    from lta_worker.worker._plan import schedule_summary
    from lta_worker.worker._wiring import instance_ttl, open_store_readonly

    now = now or SystemClock().now()
    own = store is None
    db = open_store_readonly(settings) if store is None else store
    try:
        counts = db.count_by_state()
        due = db.count_due(now)
        last = db.last_pass()
        success = last if last is not None and last.stopped == "completed" else None
        success = success or db.last_pass(stopped="completed")
        first = None if success is not None else db.first_pass()
        budget = db.budget_seen(settings.client.id)
        instances = db.live_instances(now, instance_ttl(settings))
        schedule = schedule_summary(db, settings)
        outbox = db.outbox_counts()
    finally:
        if own:
            db.close()
    plan = plan_capacity(
        users_by_state=counts,
        reads_per_active_user=len(settings.client.scopes),
        interval=settings.poll.interval,
        parked_interval=settings.poll.parked_interval,
        reserve=settings.ratelimit.reserve,
        budget_limit=budget.limit if budget else None,
        budget_window_seconds=budget.window_seconds if budget else None,
        fallback_per_hour=settings.ratelimit.fallback_per_hour,
    )
    data: dict[str, Any] = {
        "generated_at": iso(now),
        "version": __version__,
        "users": {state: counts.get(state, 0) for state in USER_STATES},
        "due": due,
        "last_pass": _pass_json(last),
        "last_success": _pass_json(success),
        "budget": None
        if budget is None
        else {
            "limit": budget.limit,
            "remaining": budget.remaining,
            "reset_at": iso(budget.reset_at),
            "window_seconds": budget.window_seconds,
            "observed_at": iso(budget.observed_at),
        },
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
        "instances": [
            {k: iso(v) if isinstance(v, datetime) else v for k, v in asdict(i).items()}
            for i in instances
        ],
    }
    problems = assess_health(
        data,
        now=now,
        interval=settings.poll.interval,
        first_pass_at=first.finished_at if first is not None else None,
    )
    data["healthy"] = not problems
    data["problems"] = problems
    return data


def assess_health(
    data: dict[str, Any],
    *,
    now: datetime,
    interval: timedelta,
    first_pass_at: datetime | None = None,
) -> list[str]:
    """The problems in `collect_status`'s data (empty: healthy); pure, takes `now`.

    Args:
        data: what `collect_status` collected (`last_pass`, `last_success`, `capacity`,
            `users`).
        now: the time of the verdict.
        interval: `poll.interval`; a success older than twice it is a problem.
        first_pass_at: when the oldest recorded pass finished (only needed when no pass
            completed): a new installation gets twice the interval from its first pass.
    """
    problems: list[str] = []
    stale_after = 2 * interval
    success = data.get("last_success")
    if success is not None:
        finished = datetime.fromisoformat(success["finished_at"])
        if now - finished > stale_after:
            problems.append(
                f"no pass completed since {success['finished_at']} (more than twice poll.interval)"
            )
    elif first_pass_at is not None and now - first_pass_at > stale_after:
        problems.append("no pass has completed yet (passes ran for more than twice poll.interval)")
    last = data.get("last_pass")
    if last is not None and last["stopped"] in {"breaker", "config"}:
        problems.append(
            f"the last pass stopped at {last['finished_at']}: {last['stopped']} "
            f"(exit {last['exit_code']}); see the pass.breaker_tripped or error event"
        )
    warning = data.get("capacity", {}).get("warning")
    if warning:
        problems.append(f"capacity: {warning}")
    rejected = data.get("users", {}).get("rejected", 0)
    if rejected:
        problems.append(f"{rejected} user(s) rejected (plain 401 while others succeed)")
    return problems
