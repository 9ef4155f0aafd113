"""README's command table lists exactly the CLI's commands, with options they take."""

from __future__ import annotations

import re
from pathlib import Path

import click

from lta_worker.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def commands() -> dict[str, click.Command]:
    """Every command that runs (groups walked through), by its full name."""
    out: dict[str, click.Command] = {}
    ctx = click.Context(cli)

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            if isinstance(command, click.Group):
                walk(command, f"{prefix}{name} ")
            elif not command.hidden:
                out[prefix + name] = command

    walk(cli, "")
    return out


def documented() -> dict[str, set[str]]:
    """The command table: each command's name, and the options its usage cell shows."""
    text = README.read_text(encoding="utf-8")
    table = text[text.index("| command | does |") :].split("\n\n", 1)[0]
    out = {}
    for usage in re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE):
        name = re.split(r" \[| --", usage, maxsplit=1)[0]
        out[name] = set(re.findall(r"--[a-z-]+", usage))
    return out


def test_command_table_lists_every_command() -> None:
    """Every command of the CLI is a row of README's table, and every row a command."""
    assert sorted(documented()) == sorted(commands())


def test_command_table_shows_only_real_options() -> None:
    """Each option a row shows is an option of that command."""
    real = commands()
    wrong = {
        name: sorted(shown - {o for p in real[name].params for o in p.opts})
        for name, shown in documented().items()
        if name in real
    }
    assert {k: v for k, v in wrong.items() if v} == {}
