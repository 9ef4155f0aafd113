"""`lta-worker [--config PATH] COMMAND`: the command line interface (each command imported
when invoked; every error one line and its exit code, `_failure`), and its standard streams
and arguments when they are not what a terminal gives: a reader gone, a closed stdout, an
encoding that cannot show a character, a non-UTF-8 locale."""

from __future__ import annotations

import gc
import io
import os
import signal
import sys

import click

from lta_worker import errors
from lta_worker.cli import _app, _commands

__all__ = [
    "cli",
    "main",
]


@click.group(cls=_commands.LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    envvar="LTA_WORKER_CONFIG",
    help="TOML config file (default: $LTA_WORKER_CONFIG).",
)
@click.option(
    "-V",
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _param, value: _print_version(ctx, value=value),
    help="Print the version and the commit it was built from, then exit.",
)
@click.option(
    "--debug",
    is_flag=True,
    envvar="LTA_WORKER_DEBUG",
    help="On an error, print the traceback too (also $LTA_WORKER_DEBUG=1).",
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool) -> None:
    """lta-worker: read enrolled users' latest change and statistics with long term tokens."""
    if ctx.invoked_subcommand != "serve":
        # Held from the process's first line (`lta_worker.__main__`) for `serve`'s sake:
        # for any other command, a pending one acts now, and a hang-up ends it as before.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    app = ctx.ensure_object(_app.App)
    app.config_path = config_path
    app.debug = app.debug or debug


def _print_version(ctx: click.Context, *, value: bool) -> None:
    """`--version`: the version and the build's commit (git is asked only here, never at start)."""
    if not value or ctx.resilient_parsing:
        return
    from lta_worker.buildinfo import version_text

    click.echo(version_text())
    ctx.exit()


def _exit_code(exc: BaseException) -> int | None:
    """The code of a SystemExit, alone or as the only kind of leaf of an exception group."""
    if isinstance(exc, SystemExit):  # every command's way out: no need for `_failure`
        found: list[BaseException] = [exc]
    else:
        from lta_worker.cli._failure import leaves

        found = list(leaves(exc))
    if found and all(isinstance(e, SystemExit) for e in found):
        code = found[0].code  # type: ignore[attr-defined]
        return code if isinstance(code, int) else (0 if code is None else 1)
    return None


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `lta-worker` console script.

    Without `argv` the process ends with the command: the objects left are frozen out of the
    collector's reach, so the interpreter's last collections skip them (about 0.1 s).
    """
    try:
        _main(argv)
    finally:
        if argv is None:
            gc.freeze()


def _main(argv: list[str] | None) -> None:
    app = _app.App(debug=_debug_from_env())
    _prepare()
    try:
        args = _arguments(argv)
        code = cli.main(args=args, prog_name="lta-worker", standalone_mode=False, obj=app)
        # What stdout still buffers goes now: a reader gone is noticed here (`_reader_gone`),
        # not by the interpreter on its way out (after `_prepare` there is a `sys.stdout`).
        sys.stdout.flush()
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `lta-worker`: the help
        exc.show()
        sys.exit(exc.exit_code)
    except BaseException as exc:  # the boundary: every error becomes one line
        if _reader_gone(exc):
            _end_quietly()
        exit_code = _exit_code(exc)
        if exit_code is not None:
            sys.exit(exit_code)
        if isinstance(exc, KeyboardInterrupt | click.exceptions.Abort):
            click.echo("Aborted.", err=True)
            sys.exit(errors.EX_INTERRUPTED)
        from lta_worker.cli._failure import log_format, report

        fmt = log_format(app.loaded_log_format, os.environ)
        sys.exit(report(exc, fmt=fmt, debug=app.debug))
    sys.exit(code if isinstance(code, int) else 0)


def _debug_from_env() -> bool:
    return os.environ.get("LTA_WORKER_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


class _ClosedOutput(io.TextIOBase):
    """Standing in for a closed standard output: the first write is a usage error."""

    def write(self, _text: str) -> int:
        raise errors.UsageError(
            "standard output is closed (descriptor 1): the command's output cannot be printed",
            hint="give the command an output: `> FILE`, or `> /dev/null` to discard it",
        )

    def isatty(self) -> bool:
        return False


def _prepare() -> None:
    """Set up the standard streams before a command runs (the module)."""
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def _arguments(argv: list[str] | None) -> list[str]:
    """The command's arguments: `argv`, or the process's own decoded as UTF-8 (UsageError else)."""
    if argv is not None:
        return argv
    out: list[str] = []
    for number, arg in enumerate(sys.argv[1:], start=1):
        try:
            out.append(os.fsencode(arg).decode("utf-8"))
        except UnicodeDecodeError:
            raise errors.UsageError(
                f"argument {number} is not UTF-8 text", hint="write user ids and paths in UTF-8"
            ) from None
    return out


def _reader_gone(exc: BaseException) -> bool:
    """True when standard output's reader went away (BrokenPipeError, or click's exit 1)."""
    if isinstance(exc, BrokenPipeError):
        return True
    # click's main catches EPIPE, wraps the streams in its (private) _PacifyFlushWrapper
    # and exits 1: that wrapper is the only trace left of the cause.
    wrapped = "PacifyFlushWrapper" in type(sys.stdout).__name__
    return isinstance(exc, SystemExit) and exc.code == 1 and wrapped


def _end_quietly() -> None:
    """After a reader went away: descriptor 1 to /dev/null (no flush again), exit 141."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)
    sys.exit(errors.EX_BROKEN_PIPE)
