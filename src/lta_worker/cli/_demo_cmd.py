"""`lta-worker demo`: the simulator, enrollment and passes on a temporary database, narrated."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the config, keys, database and log (default: a new temporary dir).",
)
@click.option(
    "--keep-serving",
    is_flag=True,
    help="Keep the simulator up after the demo (until Ctrl-C), so that `run` works on it.",
)
def demo(directory: Path | None, keep_serving: bool) -> None:
    """Run the narrated demo: 20 users enrolled and read by the worker, in under a minute."""
    from lta_worker.cli._app import require_extra

    require_extra("simulator")
    from lta_worker.cli._demo import run_demo

    sys.exit(run_demo(sys.stdout, directory, keep_serving=keep_serving))
