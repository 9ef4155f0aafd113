"""`lta-worker users list|drop|forget`: see enrolled users, end their access (`list --format
json` is a contract: `report.user_json`, docs/python-api.md); `lta-worker results export`:
what was read, as JSON lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from lta_worker.cli._app import App, pass_app, user_option
from lta_worker.errors import EX_OK, ConfigError, UnknownUserError, UpstreamError
from lta_worker.protocol import LONG_TERM_FAMILY
from lta_worker.report import iso, result_json, user_json

if TYPE_CHECKING:
    from lta_worker.domain import UserRow
    from lta_worker.enrollment import DropResult

_COMMAND = {"dropped": "drop", "forgot": "forget"}


def _short_time(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


_COLUMNS = ("USER", "STATE", "TOKEN", "SCOPES", "LAST POLLED", "NEXT DUE", "FAILS", "LAST")


def table_rows(rows: Iterable[UserRow]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per user, for people."""
    out: list[tuple[str, ...]] = []
    for row in rows:
        scopes = ",".join(s.removeprefix(LONG_TERM_FAMILY) for s in row.scopes) or "-"
        last = row.last_outcome or "-"
        if row.last_code:
            last = f"{last} ({row.last_code})"
        out.append(
            (
                row.user,
                row.state,
                "yes" if row.token is not None else "no",
                scopes,
                _short_time(row.last_polled_at),
                _short_time(row.next_due_at),
                str(row.consecutive_failures),
                last,
            )
        )
    return out


def render_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str] = _COLUMNS) -> str:
    """Left-aligned columns, two spaces apart, header first; no trailing spaces."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (tuple(columns), *rows)
    ]
    return "\n".join(lines)


@click.group("users")
def users() -> None:
    """List enrolled users; drop or forget one."""


@users.command("list")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for programs.",
)
@pass_app
def list_(app: App, fmt: str) -> None:
    """One row per user: state, token held, scopes, last poll, next due time."""
    with app.runtime(read_only=True) as runtime:
        rows = list(runtime.store.list_users())
    if fmt == "json":
        click.echo(json.dumps([user_json(r) for r in rows], indent=2))
        return
    click.echo(render_table(table_rows(rows)))
    if not rows:
        click.echo("no users yet: enroll one with `lta-worker enroll url --user ID`", err=True)


def _report(result: DropResult, verb: str) -> int:
    """Print one line saying what happened, as stored, and return 0; a drop left pending, in
    flight elsewhere or overtaken by a new consent raises the error whose line the CLI prints
    (75 not done, 78 the credential refused)."""
    purged = f"; {result.purged} stored result(s) purged" if result.purged is not None else ""
    if result.upstream == "in_flight":
        # Through the CLI's boundary, so that the line is the `error` event in JSON mode.
        raise UpstreamError(
            f"{_COMMAND[verb]} of {result.user!r} not sent: a DELETE of its token is already "
            f"out (a retry of `run`/`serve` or another `users drop`); no second one is sent, "
            f"and its outcome is stored (see `users list`){purged}"
        )
    if result.overtaken and result.state not in {"dropped", "dropping"}:
        raise UpstreamError(
            f"the {_COMMAND[verb]} of {result.user!r} was overtaken by a new consent: the user "
            f"enrolled again while the drop was under way and is {result.state} with the new "
            f"token, which is kept (the drop named the old one); run `users {_COMMAND[verb]}` "
            f"again if the new consent must go too{purged}"
        )
    if result.overtaken and result.state == "dropped":
        click.echo(
            f"{verb} {result.user!r}: another drop of it was confirmed meanwhile; "
            f"local token deleted{purged}"
        )
        return EX_OK
    if result.upstream == "ok" and not result.overtaken:
        click.echo(
            f"{verb} {result.user!r}: the service dropped the token (HTTP {result.status}); "
            f"local token deleted{purged}"
        )
        return EX_OK
    if result.upstream == "skipped":
        click.echo(
            f"{result.user!r} is {result.state}: no token is held, so there is nothing to drop "
            f"and it is left as it is{purged}"
        )
        return EX_OK
    retry = iso(result.retry_at) or "soon"
    why = result.error or "another sender retries the drop"
    message = (
        f"{verb} {result.user!r} pending: {why}; the user is `dropping` (no pass "
        f"reads it, token kept only to finish the drop) and `run`/`serve` retry the drop "
        f"(next at {retry}){purged}"
    )
    # Through the CLI's boundary, so that the line is the `error` event in JSON mode.
    if result.upstream == "refused":
        raise ConfigError(message)
    raise UpstreamError(message)


def _run_lifecycle(app: App, user: str, *, forget: bool) -> DropResult:
    runtime = app.runtime()
    import anyio

    async def main() -> DropResult:
        async with runtime:
            lifecycle = runtime.lifecycle()
            return await (lifecycle.forget(user) if forget else lifecycle.drop(user))

    return anyio.run(main)


@users.command("drop")
@user_option
@pass_app
def drop(app: App, user: str) -> None:
    """DELETE the token upstream; once confirmed, delete it locally, set the user `dropped`.

    Exit 75 when the service could not confirm (the drop is retried by `run`/`serve`),
    when a DELETE of the token is already out (none is sent beside it), or when a new
    consent overtook the drop (the user is active with the new token); 78 when the service
    refused the credential (check `client.secret_file`).
    """
    sys.exit(_report(_run_lifecycle(app, user, forget=False), "dropped"))


@users.command("forget")
@user_option
@pass_app
def forget(app: App, user: str) -> None:
    """Purge every stored result of the user at once, and drop it (exit codes as `drop`)."""
    sys.exit(_report(_run_lifecycle(app, user, forget=True), "forgot"))


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
