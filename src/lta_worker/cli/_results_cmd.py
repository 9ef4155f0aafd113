"""`lta-worker results export`: results, history or the change feed, as JSON lines."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.errors import UnknownUserError
from lta_worker.report import result_json


@click.group("results")
def results() -> None:
    """Export what the worker has read."""


@results.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl"]),
    default="jsonl",
    show_default=True,
    help="One JSON object per line.",
)
@click.option("--user", "user", metavar="ID", help="Only this user (default: every user).")
@click.option(
    "--history",
    is_flag=True,
    help="Every stored past content, oldest first, instead of the latest result.",
)
@click.option(
    "--since",
    "since",
    metavar="T",
    help="With --history: contents fetched at or after T (ISO 8601 time, or a duration "
    "such as 7d meaning that long ago).",
)
@click.option(
    "--changed-since",
    "cursor",
    metavar="CURSOR",
    help="Only the contents stored after CURSOR (0: all), oldest first (a forgotten "
    'user\'s line says its data is gone), then a last line {"cursor": C}: pass C next time.',
)
@pass_app
def export(
    app: App,
    fmt: str,
    user: str | None,
    history: bool,
    since: str | None,
    *,
    cursor: str | None,
) -> None:
    """Print the latest stored result per user and endpoint (or the change history, or the
    changes stored after a cursor)."""
    if since is not None and not history:
        raise click.UsageError("--since goes with --history")
    if cursor is not None and history:
        raise click.UsageError("--changed-since and --history are two exports: choose one")
    after = _since(since) if since is not None else None
    with app.runtime(read_only=True) as runtime:
        store = runtime.store
        if user is not None and store.get_user(user) is None:
            raise UnknownUserError(user)
        feed = store.changed_since(cursor, user) if cursor is not None else None
        if feed is not None:
            rows = feed.rows
        elif history:
            rows = store.export_history(user, after)
        else:
            rows = store.export_results(user)
        for row in rows:
            try:
                line = json.dumps(result_json(row), separators=(",", ":"), allow_nan=False)
            except ValueError:
                # Stored by an older version before payloads were strict JSON: every line
                # printed is valid JSON, so this one is left out, and said so.
                from lta_worker.logs import get_logger  # structlog: only when needed

                log = get_logger("lta_worker.results")
                endpoint = getattr(row, "endpoint", None)
                log.warning("results.skipped", user=row.user, endpoint=endpoint)
                continue
            click.echo(line)
        if feed is not None:
            click.echo(json.dumps({"cursor": feed.cursor}))


def _since(value: str) -> datetime:
    """`--since`: an ISO 8601 time (UTC when it has no offset) or a duration ago."""
    from lta_worker.config import parse_duration

    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            return datetime.now(UTC) - parse_duration(value)
        except ValueError:
            raise click.BadParameter(
                f"{value!r} is neither an ISO 8601 time (2026-11-01T00:00:00Z) nor a duration (7d)",
                param_hint="--since",
            ) from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
