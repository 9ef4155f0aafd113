"""`lta-worker status [--format table|json]`: users per state, last pass, budget, capacity,
and the webhook outbox (events waiting, dead-lettered)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from lta_worker.cli._app import App, pass_app

if TYPE_CHECKING:
    from lta_worker.config import Settings


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def collect_status(settings: Settings, now: datetime | None = None) -> dict[str, Any]:
    """Everything `status` shows, as plain JSON-able data.

    Args:
        settings: the settings in force (the database, the interval, the reserve).
        now: the time to count due users at; the system clock by default (the demo, whose
            clock is moved by hand, passes its own).
    """
    from lta_worker.domain import USER_STATES, plan_capacity
    from lta_worker.worker import SystemClock, instance_ttl, open_store

    now = now or SystemClock().now()
    store = open_store(settings)
    try:
        counts = store.count_by_state()
        due = store.count_due(now)
        last = store.last_pass()
        budget = store.budget_seen(settings.client.id)
        instances = store.live_instances(now, instance_ttl(settings))
        outbox = store.outbox_counts()
    finally:
        store.close()
    plan = plan_capacity(
        users_by_state=counts,
        reads_per_active_user=len(settings.client.scopes),
        interval=settings.poll.interval,
        parked_interval=settings.poll.parked_interval,
        reserve=settings.ratelimit.reserve,
        budget_limit=budget.limit if budget else None,
        budget_window_seconds=budget.window_seconds if budget else None,
        fallback_per_hour=settings.ratelimit.fallback_per_hour,
        instances=len(instances),
    )
    return {
        "users": {state: counts.get(state, 0) for state in USER_STATES},
        "due": due,
        "last_pass": None
        if last is None
        else {
            "instance": last.instance,
            "started_at": _iso(last.started_at),
            "finished_at": _iso(last.finished_at),
            "stopped": last.stopped,
            "exit_code": last.exit_code,
            "reads": last.reads,
            "throttled": last.throttled,
            "counts": dict(last.counts),
        },
        "budget": None
        if budget is None
        else {
            "limit": budget.limit,
            "remaining": budget.remaining,
            "reset_at": _iso(budget.reset_at),
            "window_seconds": budget.window_seconds,
            "observed_at": _iso(budget.observed_at),
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
        "instances": [
            {k: _iso(v) if isinstance(v, datetime) else v for k, v in asdict(i).items()}
            for i in instances
        ],
        "webhooks": {
            "enabled": settings.webhook.url is not None,
            "backlog": outbox.backlog,
            "dead_letter": outbox.dead,
            "oldest_backlog_at": _iso(outbox.oldest_at),
        },
    }


def _or_unknown(value: object) -> str:
    return "unknown" if value is None else str(value)


def render_table(data: dict[str, Any]) -> str:
    """The people's view of `collect_status`."""
    from lta_worker.config import format_duration

    lines = ["users"]
    lines += [f"  {state:<10} {n:>8}" for state, n in data["users"].items()]
    lines.append(f"  {'due now':<10} {data['due']:>8}")
    last = data["last_pass"]
    lines.append("last pass")
    if last is None:
        lines.append("  none yet")
    else:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(last["counts"].items()) if v)
        lines.append(f"  {last['finished_at']}  {last['stopped']} (exit {last['exit_code']})")
        lines.append(f"  {last['reads']} reads, {last['throttled']} throttled; {counts or '-'}")
    budget = data["budget"]
    lines.append("budget last seen")
    if budget is None:
        lines.append("  none yet (the fallback rate applies until a RateLimit header is seen)")
    else:
        window = budget["window_seconds"]
        lines.append(
            f"  {_or_unknown(budget['remaining'])} of {_or_unknown(budget['limit'])} left, "
            f"window {'unknown' if window is None else f'{window:g} s'}, "
            f"reset {_or_unknown(budget['reset_at'])}"
        )
    cap = data["capacity"]
    lines.append("capacity")
    lines.append(
        f"  needed {cap['reads_needed_per_hour']} reads/h, available "
        f"{cap['available_per_hour']} reads/h" + ("" if cap["budget_known"] else " (fallback rate)")
    )
    effective = format_duration(timedelta(seconds=cap["effective_interval_s"]))
    lines.append(f"  each user read every {effective}")
    if cap["warning"]:
        lines.append(f"  WARNING: {cap['warning']}")
    hooks = data["webhooks"]
    lines.append("webhooks" + ("" if hooks["enabled"] else " (off: no webhook.url)"))
    lines.append(f"  {hooks['backlog']} waiting, {hooks['dead_letter']} dead-lettered")
    if hooks["oldest_backlog_at"]:
        lines.append(f"  oldest waiting since {hooks['oldest_backlog_at']}")
    if data["instances"]:
        lines.append("instances")
        lines += [
            f"  {i['instance']} ({i['kind']}) seen {i['heartbeat_at']}" for i in data["instances"]
        ]
    return "\n".join(lines)


@click.command("status")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@pass_app
def status(app: App, fmt: str) -> None:
    """Users per state, the last pass, the budget seen and a capacity plan."""
    data = collect_status(app.settings)
    click.echo(json.dumps(data, indent=2) if fmt == "json" else render_table(data))
