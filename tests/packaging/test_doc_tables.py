"""README's and docs/operations.md's lists of commands, exit codes, metrics and the version
name exactly what the code has."""

from __future__ import annotations

import re

import click
import pytest

from lta_worker import __version__, errors
from lta_worker.cli import cli
from lta_worker.domain import EXIT_CODES
from lta_worker.worker._metrics import Metrics
from support.docs import read, table

# Every code a command other than `run` exits with: the EX_* constants (with `status
# --check` unhealthy, SIGPIPE and an interruption) and a bug (an exception's default code).
COMMAND_CODES = {
    *(v for k, v in vars(errors).items() if k.startswith("EX_")),
    errors.LtaError.exit_code,
}


def _commands() -> dict[str, click.Command]:
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


def test_command_table_lists_every_command_with_real_options() -> None:
    """README's command table has a row per CLI command, each showing only options it takes."""
    real, shown = _commands(), {}
    for row in table(read("README.md"), "| command | does |"):
        usage = row[0].strip("`")
        shown[re.split(r" \[| --", usage, maxsplit=1)[0]] = set(re.findall(r"--[a-z-]+", usage))
    assert sorted(shown) == sorted(real)
    wrong = {n: o - {x for p in real[n].params for x in p.opts} for n, o in shown.items()}
    assert {k: sorted(v) for k, v in wrong.items() if v} == {}


@pytest.mark.parametrize(
    ("heading", "codes"),
    [
        ("`run` (timer, cron):", set(EXIT_CODES.values())),
        ("Every other command, `serve` included:", COMMAND_CODES),
    ],
)
def test_exit_code_table_lists_every_code(heading: str, codes: set[int]) -> None:
    """Each exit code table of docs/operations.md lists exactly the codes its commands exit with."""
    text = read("docs/operations.md")
    rows = table(text[text.index(heading) :], "| code |")
    assert {int(row[0]) for row in rows} == codes


def test_readme_names_runs_codes() -> None:
    """README's summary of `run`'s exit codes names each code a pass ends with."""
    text = read("README.md")
    summary = text[text.index("Exit codes of `run`:") :].split("Every other command:", 1)[0]
    assert {int(c) for c in re.findall(r"\*\*(\d+)\*\*", summary)} == set(EXIT_CODES.values())


def test_metrics_table_is_what_the_worker_registers() -> None:
    """docs/operations.md lists every registered metric with its type and labels, and no other."""
    code = set()
    for metric in Metrics().registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        labels = {k for sample in metric.samples for k in sample.labels if k != "le"}
        assert metric.samples, f"{metric.name}: no series to show its labels"
        code.add((name, metric.type, tuple(sorted(labels))))
    rows = [
        (name, cells[1], tuple(sorted(labels.split(","))) if labels else ())
        for cells in table(read("docs/operations.md"), "| metric | type | meaning |")
        for name, labels in re.findall(r"`(lta_worker_\w+)(?:\{([^}]*)\})?`", cells[0])
    ]
    assert len(rows) == len({name for name, _, _ in rows}), "a metric is listed twice"
    assert code - set(rows) == set(), "registered, not documented as such"
    assert set(rows) - code == set(), "documented, not registered as such"


def test_docs_name_this_version() -> None:
    """operations.md's wheel files are this version's; CHANGELOG.md has its section, under
    Unreleased (Keep a Changelog)."""
    wheels = re.findall(r"lta_worker-([^-\s]+)-py3-none-any\.whl", read("docs/operations.md"))
    assert wheels
    assert set(wheels) == {__version__}
    headings = re.findall(r"^## \[([^\]]+)\]", read("CHANGELOG.md"), flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert __version__ in headings
