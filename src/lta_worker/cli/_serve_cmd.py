"""`lta-worker serve`: the long-running service (systemd Type=notify)."""

from __future__ import annotations

import os
import sys

import click

from lta_worker.cli._app import App, pass_app, require_extra
from lta_worker.config import Settings, load_settings


@click.command("serve")
@pass_app
def serve(app: App) -> None:
    """Serve: passes every poll.tick, maintenance and heartbeat, until SIGTERM."""
    settings = app.settings
    if settings.enroll.listen is not None:
        require_extra("web")
    app.configure_logging()

    import anyio

    from lta_worker.worker import serve as serve_forever

    def reload() -> Settings:
        return load_settings(app.config_path, os.environ)

    sys.exit(anyio.run(lambda: serve_forever(settings, reload_settings=reload, bounded=True)))
