"""`lta-worker users list|drop|forget`: see enrolled users, end their access (`list --format
json` is a contract: `report.user_json`, docs/python-api.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from lta_worker.cli._app import App, pass_app, user_option
from lta_worker.errors import EX_OK, ConfigError, UpstreamError
from lta_worker.protocol import LONG_TERM_FAMILY
from lta_worker.report import iso, user_json

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
