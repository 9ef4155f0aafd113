"""The commands of the root group, each imported only when it is the one invoked.

Each command lives in its own `<name>_cmd.py` module, which imports only click and light
modules at import time; heavy work is imported inside the command. The root group knows
the commands by name (`COMMANDS`) and imports a command's module when it is invoked (or
listed by `--help`), so `lta-worker run` does not import the demo, the simulator, the
deploy files or enrollment to start.
"""

from __future__ import annotations

import importlib
from typing import Final

import click

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "run": ("_run_cmd", "run"),
    "serve": ("_serve_cmd", "serve"),
    "enroll": ("_enroll_cmd", "enroll"),
    "users": ("_users_cmd", "users"),
    "results": ("_results_cmd", "results"),
    "keys": ("_keys_cmd", "keys"),
    "db": ("_db_cmd", "db"),
    "status": ("_status_cmd", "status"),
    "check": ("_check_cmd", "check"),
    "simulator": ("_simulator_cmd", "simulator"),
    "demo": ("_demo_cmd", "demo"),
    "deploy-files": ("_deploy_cmd", "deploy_files"),
}
"""Command name -> (module of `lta_worker.cli`, attribute)."""


def load(name: str) -> click.Command | None:
    """The command called `name` (its module imported now), or None when there is none."""
    found = COMMANDS.get(name)
    if found is None:
        return None
    module, attribute = found
    command = getattr(importlib.import_module(f"lta_worker.cli.{module}"), attribute)
    assert isinstance(command, click.Command), name
    return command


class LazyGroup(click.Group):
    """A group whose commands are `COMMANDS`, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, sorted (as click lists them)."""
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command `cmd_name`, imported on first use."""
        command = self.commands.get(cmd_name)
        if command is None:
            command = load(cmd_name)
            if command is not None:
                self.add_command(command, cmd_name)
        return command
