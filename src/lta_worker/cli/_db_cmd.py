"""`lta-worker db upgrade`: bring the database schema up to date (run and serve also do)."""

from __future__ import annotations

import click

from lta_worker.cli._app import App, pass_app


@click.group()
def db() -> None:
    """Database schema."""


@db.command()
@pass_app
def upgrade(app: App) -> None:
    """Apply the pending schema migrations to database.url.

    Exits 78 when the database was migrated by a newer lta-worker (nothing is changed).
    """
    from lta_worker.storage import HEAD_REVISION

    with app.runtime() as runtime:
        _ = runtime.store  # opening it applies the pending migrations
    if runtime.migrated:
        click.echo(f"database schema upgraded to revision {HEAD_REVISION}")
    else:
        click.echo(f"database schema is current (revision {HEAD_REVISION})")
