"""`lta-worker serve`: the long-running service (systemd Type=notify)."""

from __future__ import annotations

import importlib.util
import os
import sys

import click

from lta_worker.cli._app import App, pass_app
from lta_worker.config import Settings, load_settings
from lta_worker.errors import ConfigError

# What the `[web]` extra installs; imported only when `enroll.listen` is set.
WEB_EXTRA = ("starlette", "uvicorn")


def require_web_extra() -> None:
    """Stop with one line (exit 78) when enroll.listen is set without the `[web]` extra.

    Raises:
        ConfigError: starlette or uvicorn cannot be imported.
    """
    for name in WEB_EXTRA:
        if importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"serving the browser enrollment needs {name}, which is not installed",
                key="enroll.listen",
                hint="install the extra: pip install 'lta-worker[web]', or unset enroll.listen",
            )


@click.command("serve")
@pass_app
def serve(app: App) -> None:
    """Serve: passes every poll.tick, maintenance and heartbeat, until SIGTERM."""
    settings = app.settings
    if settings.enroll.listen is not None:
        require_web_extra()
    app.configure_logging()

    import anyio

    from lta_worker.worker import serve as serve_forever

    def reload() -> Settings:
        return load_settings(app.config_path, os.environ)

    sys.exit(anyio.run(lambda: serve_forever(settings, reload_settings=reload)))
