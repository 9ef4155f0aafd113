"""`lta-worker status [--format table|json] [--check]`, read-only (`report.collect_status`)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.errors import EX_UNHEALTHY
from lta_worker.report import collect_status


def _or_unknown(value: object) -> str:
    return "unknown" if value is None else str(value)


def render_table(data: dict[str, Any]) -> str:
    """The people's view of `collect_status`."""
    from lta_worker.config import format_duration

    def duration(seconds: float) -> str:
        return format_duration(timedelta(seconds=seconds))

    users = [f"  {state:<10} {n:>8}" for state, n in data["users"].items()]
    lines = ["users", *users, f"  {'due now':<10} {data['due']:>8}", "last pass"]
    last = data["last_pass"]
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
    effective = duration(cap["effective_interval_s"])
    if data["schedule"]["mode"] == "adaptive":  # the capacity is that of max_interval
        lines.append(f"  each user read at least every {effective} (per class: schedule)")
    else:
        lines.append(f"  each user read every {effective}")
    if cap["warning"]:
        lines.append(f"  WARNING: {cap['warning']}")
    sched = data["schedule"]
    lines.append(f"schedule: {sched['mode']}, stats {sched['stats']}")
    for c in sched["classes"]:
        delay = c["expected_delay_s"]
        then = "" if delay is None else f", expected delay {duration(delay)}"
        lines.append(f"  {c['class']:<10} {c['users']:>8}  every {duration(c['interval_s'])}{then}")
    if sched["expected_delay_s"] is not None:
        average = duration(sched["expected_delay_s"])
        lines.append(f"  a change arrives after {average} on average (expected)")
    hooks = data["webhooks"]
    lines.append("webhooks" + ("" if hooks["enabled"] else " (off: no webhook.url)"))
    lines.append(f"  {hooks['backlog']} waiting, {hooks['dead_letter']} dead-lettered")
    if hooks["oldest_backlog_at"]:
        lines.append(f"  oldest waiting since {hooks['oldest_backlog_at']}")
    lines.append("health")
    if data["healthy"]:
        lines.append("  healthy")
    lines += [f"  PROBLEM: {problem}" for problem in data["problems"]]
    if data["instances"]:
        lines.append("instances")
        lines += [
            f"  {i['instance']} ({i['kind']}) seen {i['heartbeat_at']}" for i in data["instances"]
        ]
    return "\n".join(lines)


@click.command("status")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option(
    "--check",
    is_flag=True,
    help="Exit 1 when unhealthy (`problems` not empty), 0 when healthy.",
)
@pass_app
def status(app: App, fmt: str, check: bool) -> None:
    """Users per state, the last pass, the budget seen, a capacity plan and the health."""
    data = collect_status(app.settings)
    click.echo(json.dumps(data, indent=2) if fmt == "json" else render_table(data))
    if check and not data["healthy"]:
        sys.exit(EX_UNHEALTHY)
