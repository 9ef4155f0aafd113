"""The CLI's shared context: the config path, lazily loaded settings, and logging."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import click

from lta_worker.config import load_settings
from lta_worker.errors import ConfigError

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.runtime import Runtime


@dataclass
class App:
    """What every command gets through `click.pass_obj`."""

    config_path: str | None = None
    debug: bool = False
    _logging_ready: bool = field(default=False, repr=False)

    @cached_property
    def settings(self) -> Settings:
        """The validated settings (ConfigError, exit 78, when they are wrong)."""
        return load_settings(self.config_path, os.environ)

    @property
    def loaded_log_format(self) -> str | None:
        """`log.format` of the settings when they loaded, else None (for the error line)."""
        settings = self.__dict__.get("settings")
        return settings.log.format if settings is not None else None

    def configure_logging(self) -> None:
        """Configure structlog from the settings, once."""
        if self._logging_ready:
            return
        import sys

        from lta_worker.logs import configure_logging, stderr_is_journal

        log = self.settings.log
        configure_logging(
            log.level,
            log.format,
            read_level=log.read_level,
            journal=stderr_is_journal(os.environ, sys.stderr),
        )
        self._logging_ready = True

    def runtime(self, *, read_only: bool = False) -> Runtime:
        """A `Runtime` over the settings, logging configured (the settings load first)."""
        settings = self.settings
        self.configure_logging()
        from lta_worker.runtime import Runtime

        return Runtime(settings, read_only=read_only)


pass_app = click.make_pass_decorator(App)
user_option = click.option(
    "--user", "user", required=True, metavar="ID", help="Your application's id of the user."
)

# What the `[web]` and `[simulator]` extras install: `run` and `serve` never import them
# (but `serve` with `enroll.listen` set).
EXTRA_MODULES = ("starlette", "uvicorn")


def require_extra(extra: Literal["web", "simulator"]) -> None:
    """Raise ConfigError (exit 78) when a module of the `[web]` or `[simulator]` extra is
    not installed."""
    web = extra == "web"
    for name in EXTRA_MODULES:
        if importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"{'serving the browser enrollment' if web else 'the simulator'} needs {name}, "
                "which is not installed",
                key="enroll.listen" if web else None,
                hint=f"install the extra: pip install 'lta-worker[{extra}]'"
                + (", or unset enroll.listen" if web else ""),
            )
