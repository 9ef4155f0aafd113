"""Registers every command group on the root group.

Each command lives in its own `<name>_cmd.py` module, which imports only click and light
modules at import time; heavy work is imported inside the command, so `--help` and a `run`
with nothing due start fast.
"""

from __future__ import annotations

import click

from lta_worker.cli._check_cmd import check
from lta_worker.cli._db_cmd import db
from lta_worker.cli._demo_cmd import demo
from lta_worker.cli._deploy_cmd import deploy_files
from lta_worker.cli._enroll_cmd import enroll
from lta_worker.cli._keys_cmd import keys
from lta_worker.cli._results_cmd import results
from lta_worker.cli._run_cmd import run
from lta_worker.cli._serve_cmd import serve
from lta_worker.cli._simulator_cmd import simulator
from lta_worker.cli._status_cmd import status
from lta_worker.cli._users_cmd import users

COMMANDS: tuple[click.Command, ...] = (
    run,
    serve,
    enroll,
    users,
    results,
    keys,
    db,
    status,
    check,
    simulator,
    demo,
    deploy_files,
)


def register(group: click.Group) -> None:
    """Add every command to `group`."""
    for command in COMMANDS:
        group.add_command(command)
