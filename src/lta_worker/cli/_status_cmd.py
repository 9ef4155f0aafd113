"""`lta-worker status` (read-only, `report.collect_status`) and `lta-worker check` (everything
`run` needs, verified without writing)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.errors import EX_CONFIG, EX_OK, EX_TEMPFAIL, EX_UNHEALTHY
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


def _exit_code(codes: list[int]) -> int:
    """The worst code: configuration beats temporary beats ok (a bug counts as 78)."""
    if not codes:
        return EX_OK
    if all(code == EX_TEMPFAIL for code in codes):
        return EX_TEMPFAIL
    return EX_CONFIG


@click.command("check")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@pass_app
def check(app: App, fmt: str) -> None:
    """Check config, secret and key files, database and service; write nothing."""
    from lta_worker.cli._failure import classify, one_line
    from lta_worker.errors import LtaError
    from lta_worker.logs import scrub

    def failed(name: str, exc: BaseException) -> dict[str, Any]:
        failure = classify(exc)
        return {
            "name": name,
            "ok": False,
            "detail": "unusable",
            "exit_code": failure.exit_code,
            "error": failure.error,
            "message": one_line(scrub(failure.message)),
            "hint": scrub(failure.hint) if failure.hint else None,
        }

    errors: list[BaseException] = []
    try:
        settings = app.settings
    except LtaError as exc:  # nothing else can be checked; `--format json` still prints
        errors.append(exc)
        checks = [failed("config", exc)]
    else:
        app.configure_logging()
        import anyio

        from lta_worker.worker import run_checks

        checks = [{"name": "config", "ok": True, "detail": "loaded"}]
        for result in anyio.run(run_checks, settings):
            if result.error is None:
                checks.append({"name": result.name, "ok": True, "detail": result.detail})
            else:
                errors.append(result.error)
                checks.append({**failed(result.name, result.error), "detail": result.detail})
        if settings.enroll.listen is not None:  # what `serve` refuses at start, in the CLI
            from lta_worker.cli._app import require_extra

            try:
                require_extra("web")
            except LtaError as exc:  # the address may be free: `serve` still cannot start
                errors.append(exc)
                checks = [c for c in checks if c["name"] != "enroll_listen"]
                checks.append(failed("enroll_listen", exc))
    code = _exit_code([entry["exit_code"] for entry in checks if not entry["ok"]])
    if fmt == "json":
        click.echo(json.dumps({"ok": code == EX_OK, "exit_code": code, "checks": checks}, indent=2))
    else:
        for entry in checks:
            if entry["ok"]:
                click.echo(f"ok    {entry['name']:<14} {entry['detail']}")
            else:
                hint = f" ({entry['hint']})" if entry["hint"] else ""
                click.echo(f"FAIL  {entry['name']:<14} {entry['message']}{hint}")
    # The CLI's boundary writes the first problem of the exit code's kind as the `error`
    # event on stderr, as every failing command ends (a bug alone has none: 78, no event).
    worst = next((e for e in errors if classify(e).exit_code == code), None)
    if worst is not None:
        raise worst
    sys.exit(code)
