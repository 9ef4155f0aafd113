"""`lta-worker simulator serve` (plain HTTP with demo secrets: loopback unless `--host` names
another) and `lta-worker demo` on it (`_demo`)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from lta_worker.cli._app import require_extra
from lta_worker.config import is_loopback_host

if TYPE_CHECKING:
    from lta_worker.simulator import RunningSimulator

HEADER_FORMAT_CHOICES = ("draft", "combined", "triple", "x", "none")
ERROR_STYLE_CHOICES = ("json", "code", "nested", "problem", "header")


@click.group(name="simulator")
def simulator() -> None:
    """Run the bundled simulator of the Long Term Access service (demos, tests, benchmarks)."""


@simulator.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="LTA_SIMULATOR_HOST",
              help="Listen address; non-loopback only when given as --host.")  # fmt: skip
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0 picks a free one).")  # fmt: skip
@click.option("--window", type=click.IntRange(min=1), default=3600, show_default=True,
              metavar="SECONDS", help="Length of the rate-limit window.")  # fmt: skip
@click.option("--budget", type=click.IntRange(min=0), default=120, show_default=True,
              metavar="N", help="Requests per client per window.")  # fmt: skip
@click.option("--header-format", type=click.Choice(HEADER_FORMAT_CHOICES), default="draft",
              show_default=True, help="How RateLimit headers are rendered.")  # fmt: skip
@click.option("--error-style", type=click.Choice(ERROR_STYLE_CHOICES), default="json",
              show_default=True, help="Where error codes travel in error answers.")  # fmt: skip
@click.option("--auto-consent/--no-auto-consent", default=False, show_default=True,
              help="With no consent queued, approve for login_hint or a new user.")  # fmt: skip
@click.option("--consent-page/--no-consent-page", default=False, show_default=True,
              help="With no consent queued, show a consent page (Allow / Deny).")  # fmt: skip
@click.pass_context
def serve(
    ctx: click.Context,
    *,
    host: str,
    port: int,
    window: int,
    budget: int,
    header_format: str,
    error_style: str,
    auto_consent: bool,
    consent_page: bool,
) -> None:
    """Serve the simulator until Ctrl-C; prints its URLs and the demo clients' secrets."""
    require_extra("simulator")
    from lta_worker.simulator import SimSettings, Simulator, start_in_thread

    source = ctx.get_parameter_source("host")
    if not is_loopback_host(host) and source is not click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(
            f"refusing to listen on non-loopback host {host!r} unless given as --host"
        )
    settings = SimSettings(
        budget=budget,
        window=window,
        header_format=header_format,  # type: ignore[arg-type]  # click.Choice checked it
        error_style=error_style,  # type: ignore[arg-type]  # click.Choice checked it
        auto_consent=auto_consent,
        consent_page=consent_page,
    )
    sim = Simulator(settings=settings)
    try:
        running = start_in_thread(sim, host=host, port=port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    _print_banner(running)
    if not is_loopback_host(host):
        click.echo("warning: listening beyond loopback over plain HTTP with demo secrets", err=True)

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        running.wait()
    except KeyboardInterrupt:
        click.echo("stopping", err=True)
    finally:
        running.stop()
        signal.signal(signal.SIGTERM, previous)


def _print_banner(running: RunningSimulator) -> None:
    sim = running.sim
    click.echo(f"base_url    = {running.base_url}")
    click.echo(f"auth_url    = {running.auth_url}")
    click.echo(f"control_api = {running.control_url}/")
    for client_id in sorted(sim.world.clients):
        info = sim.client_info(client_id)
        mode = "long term mode open" if info["long_term"] else "long term mode not open"
        # Printing these is intended: they are the simulator's own demo secrets.
        click.echo(f"client {client_id}: secret {sim.client_secret(client_id)} ({mode})")
    click.echo("Press Ctrl-C to stop.")


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
    require_extra("simulator")
    from lta_worker.cli._demo import run_demo

    sys.exit(run_demo(sys.stdout, directory, keep_serving=keep_serving))
