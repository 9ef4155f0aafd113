"""`lta-worker [--config PATH] COMMAND`: the command line interface.

Each command group lives in its own module and is registered on `cli` below. Errors that
lta-worker raises on purpose (`LtaError`) are printed as one line saying what to do and
exit with their code (2 usage, 75 temporary, 78 configuration); nothing else is caught here,
so a bug still shows its traceback (rendered without frame locals by the log setup).
"""

from __future__ import annotations

import sys

import click

from lta_worker import __version__
from lta_worker.errors import EX_USAGE, LtaError
from lta_worker.worker.cli.app import App


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    envvar="LTA_WORKER_CONFIG",
    help="TOML config file (default: $LTA_WORKER_CONFIG).",
)
@click.version_option(__version__, prog_name="lta-worker")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """lta-worker: read enrolled users' latest change and statistics with long term tokens."""
    ctx.obj = App(config_path=config_path)


def _register() -> None:
    from lta_worker.worker.cli import commands

    commands.register(cli)


def report_error(exc: LtaError) -> None:
    """Print an LtaError as one line on stderr (the message never holds a secret)."""
    from lta_worker.worker.logs import scrub

    click.echo(f"lta-worker: error: {scrub(str(exc))}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `lta-worker` console script."""
    _register()
    try:
        code = cli.main(args=argv, prog_name="lta-worker", standalone_mode=False)
    except LtaError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if exc.exit_code else EX_USAGE)
    sys.exit(code if isinstance(code, int) else 0)
