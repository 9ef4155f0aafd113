"""The root group's commands by name, each module imported only when its command is invoked
(or listed by `--help`), so that `lta-worker run` imports nothing it does not use."""

from __future__ import annotations

import importlib
from typing import Final

import click

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "run": ("_run_cmd", "run"),
    "serve": ("_run_cmd", "serve"),
    "enroll": ("_enroll_cmd", "enroll"),
    "users": ("_users_cmd", "users"),
    "results": ("_users_cmd", "results"),
    "keys": ("_setup_cmd", "keys"),
    "db": ("_setup_cmd", "db"),
    "status": ("_status_cmd", "status"),
    "check": ("_status_cmd", "check"),
    "simulator": ("_simulator_cmd", "simulator"),
    "demo": ("_simulator_cmd", "demo"),
    "deploy-files": ("_setup_cmd", "deploy_files"),
}
"""Command name -> (module of `lta_worker.cli`, attribute)."""


class LazyGroup(click.Group):
    """A group whose commands are `COMMANDS`, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, sorted (as click lists them)."""
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command `cmd_name`, imported on first use."""
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"lta_worker.cli.{module}"), attribute)
            assert isinstance(command, click.Command), cmd_name
            self.add_command(command, cmd_name)
        return command
