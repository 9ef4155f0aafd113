"""The CLI's standard streams and arguments when they are not what a terminal gives: a
reader gone, a closed stdout, an encoding that cannot show a character, a non-UTF-8 locale.
"""

from __future__ import annotations

import io
import os
import sys

from lta_worker.errors import EX_BROKEN_PIPE, UsageError


class _ClosedOutput(io.TextIOBase):
    """Standing in for a closed standard output: the first write is a usage error."""

    def write(self, _text: str) -> int:
        raise UsageError(
            "standard output is closed (descriptor 1): the command's output cannot be printed",
            hint="give the command an output: `> FILE`, or `> /dev/null` to discard it",
        )

    def isatty(self) -> bool:
        return False


def prepare() -> None:
    """Set up the standard streams before a command runs (the module)."""
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def arguments(argv: list[str] | None) -> list[str]:
    """The command's arguments: `argv`, or the process's own decoded as UTF-8 (UsageError else)."""
    if argv is not None:
        return argv
    out: list[str] = []
    for number, arg in enumerate(sys.argv[1:], start=1):
        try:
            out.append(os.fsencode(arg).decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError(
                f"argument {number} is not UTF-8 text", hint="write user ids and paths in UTF-8"
            ) from None
    return out


def reader_gone(exc: BaseException) -> bool:
    """True when standard output's reader went away (BrokenPipeError, or click's exit 1)."""
    if isinstance(exc, BrokenPipeError):
        return True
    # click's main catches EPIPE, wraps the streams in its (private) _PacifyFlushWrapper
    # and exits 1: that wrapper is the only trace left of the cause.
    wrapped = "PacifyFlushWrapper" in type(sys.stdout).__name__
    return isinstance(exc, SystemExit) and exc.code == 1 and wrapped


def end_quietly() -> None:
    """After a reader went away: descriptor 1 to /dev/null (no flush again), exit 141."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)
    sys.exit(EX_BROKEN_PIPE)
