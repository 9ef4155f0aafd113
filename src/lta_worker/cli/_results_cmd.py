"""`lta-worker results export [--format jsonl] [--user ID]`: the latest result per user and
endpoint, one JSON object per line: `user`, `endpoint`, `status` (`ok`|`none`), `payload`,
`fetched_at`, `changed_at`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.cli._users_cmd import iso
from lta_worker.errors import UnknownUserError

if TYPE_CHECKING:
    from lta_worker.domain import ResultRow


def result_json(row: ResultRow) -> dict[str, Any]:
    """One exported result as a JSON-ready dict."""
    return {
        "user": row.user,
        "endpoint": row.endpoint,
        "status": row.status,
        "payload": row.payload,
        "fetched_at": iso(row.fetched_at),
        "changed_at": iso(row.changed_at),
    }


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
@pass_app
def export(app: App, fmt: str, user: str | None) -> None:
    """Print the latest stored result per user and endpoint."""
    settings = app.settings
    app.configure_logging()
    from lta_worker.worker import open_store_readonly

    store = open_store_readonly(settings)
    try:
        if user is not None and store.get_user(user) is None:
            raise UnknownUserError(user)
        for row in store.export_results(user):
            try:
                line = json.dumps(result_json(row), separators=(",", ":"), allow_nan=False)
            except ValueError:
                # Stored by an older version before payloads were strict JSON: every line
                # printed is valid JSON, so this one is left out, and said so.
                from lta_worker.logs import get_logger  # structlog: only when needed

                log = get_logger("lta_worker.results")
                log.warning("results.skipped", user=row.user, endpoint=row.endpoint)
                continue
            click.echo(line)
    finally:
        store.close()
