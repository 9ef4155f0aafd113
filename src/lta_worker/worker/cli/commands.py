"""Registers every command group on the root group.

Each module below defines its commands; adding a group means adding one line here.
"""

from __future__ import annotations

import importlib

import click

# (module under lta_worker.worker.cli, attribute): registered when the module exists.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("run", "run"),
    ("serve", "serve"),
    ("enroll", "enroll"),
    ("users", "users"),
    ("results", "results"),
    ("keys", "keys"),
    ("db", "db"),
    ("status", "status"),
    ("simulator", "simulator"),
    ("demo", "demo"),
)


def register(group: click.Group) -> None:
    """Add every available command to `group`."""
    for module_name, attr in COMMANDS:
        try:
            module = importlib.import_module(f"lta_worker.worker.cli.{module_name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"lta_worker.worker.cli.{module_name}_cmd":
                raise
            continue
        command = getattr(module, attr)
        group.add_command(command)
