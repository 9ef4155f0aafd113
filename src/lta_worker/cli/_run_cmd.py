"""`lta-worker run`: one pass over every due user, then exit; `lta-worker serve`: the
long-running service (systemd Type=notify)."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import click

from lta_worker.cli._app import App, pass_app, require_extra
from lta_worker.config import Settings, load_settings, parse_duration
from lta_worker.errors import UsageError


def _duration(value: str | None) -> timedelta | None:
    if value is None:
        return None
    try:
        result = parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"--max-duration: {exc}") from None
    if result <= timedelta(0):
        raise UsageError("--max-duration must be longer than 0s")
    return result


@click.command("run")
@click.option(
    "--max-duration",
    metavar="D",
    help="Stop after this long, e.g. 50m (default: poll.max_pass_duration).",
)
@pass_app
def run(app: App, max_duration: str | None) -> None:
    """Run one pass over every due user, then exit (for cron or a systemd timer)."""
    limit = _duration(max_duration)
    settings = app.settings
    from lta_worker.cli._progress import progress_line
    from lta_worker.logs import configure_logging

    # On a terminal the log lines go through the progress line, so neither overwrites
    # the other; elsewhere stderr stays plain (JSON lines, no progress line).
    line = progress_line(sys.stderr)
    if line is None:
        app.configure_logging()
    else:
        configure_logging(
            settings.log.level,
            settings.log.format,
            line,  # type: ignore[arg-type]
            read_level=settings.log.read_level,
        )

    import signal

    import anyio

    from lta_worker.cli._progress import progress_for
    from lta_worker.logs import get_logger
    from lta_worker.worker import PassResult, Worker, stop_error

    async def main() -> PassResult:
        grace = settings.serve.grace_period.total_seconds()
        async with Worker(settings, kind="run") as worker:
            # SIGTERM (systemctl stop, a timer's unit stopping) or Ctrl-C: stop claiming,
            # let in-flight reads finish within the grace period, commit, exit 75.
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async with anyio.create_task_group() as tg:

                    async def stop_on_signal() -> None:
                        async for signum in signals:
                            name = signal.Signals(signum).name
                            get_logger("lta_worker.run").info(
                                "pass.stopping", signal=name, grace_s=grace
                            )
                            worker.request_stop(grace)

                    tg.start_soon(stop_on_signal)
                    with progress_for(line or sys.stderr, worker.clock) as on_progress:
                        result = await worker.run_pass(max_duration=limit, on_progress=on_progress)
                    tg.cancel_scope.cancel()
            return result

    result = anyio.run(main)
    if result.exit_code:  # the CLI's boundary writes it: the `error` event, the last line
        raise stop_error(result.stopped)


@click.command("serve")
@pass_app
def serve(app: App) -> None:
    """Serve: passes every poll.tick, maintenance and heartbeat, until SIGTERM."""
    settings = app.settings
    if settings.enroll.listen is not None:
        require_extra("web")
    app.configure_logging()

    import anyio

    from lta_worker.worker import serve as serve_forever

    def reload() -> Settings:
        return load_settings(app.config_path, os.environ)

    sys.exit(anyio.run(lambda: serve_forever(settings, reload_settings=reload, bounded=True)))
