"""The CLI's standard streams and arguments when they are not what a terminal gives.

- A reader that went away (`lta-worker results export | head -1`): the command ends
  quietly with 141, as a shell reports a program killed by SIGPIPE (`yes | head -1`), not
  with exit 1 ("a bug") and no line. Python ignores SIGPIPE, so the write fails with EPIPE;
  click turns that into exit 1 and makes the streams ignore later flushes.
- A closed descriptor (`>&-`): Python then has no `sys.stdout`, and click prints nothing,
  so a command whose output is the point would exit 0 having printed nothing. A stand-in
  refuses the first write, a usage error (2) that says why; `run` and `serve`, which write
  only to stderr, are not affected.
- An encoding that cannot show a character (`PYTHONIOENCODING=ascii`, a C locale without
  UTF-8 mode): the character is escaped (`\\xfc`), as Python does on stderr, instead of
  failing the command with UnicodeEncodeError.
- Arguments under a locale that is not UTF-8 (`LC_ALL=C` without UTF-8 mode): Python
  decodes their bytes as ASCII, a user id `ünï` becomes lone surrogates that no database
  or stream takes; they are decoded as UTF-8 again (`arguments`), and an argument that is
  not UTF-8 either is a usage error.
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
    """The command's arguments as text: `argv`, or the process's own decoded as UTF-8.

    Raises:
        UsageError: an argument is not UTF-8 text.
    """
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
    """True when the command failed because standard output's reader went away: a
    BrokenPipeError, or the exit 1 click makes of one (after wrapping the streams)."""
    if isinstance(exc, BrokenPipeError):
        return True
    # click's main catches EPIPE, wraps the streams in its (private) _PacifyFlushWrapper
    # and exits 1: that wrapper is the only trace left of the cause.
    wrapped = "PacifyFlushWrapper" in type(sys.stdout).__name__
    return isinstance(exc, SystemExit) and exc.code == 1 and wrapped


def end_quietly() -> None:
    """After a reader went away: point descriptor 1 at /dev/null (so that nothing tries to
    flush into the broken pipe again) and exit 141."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)
    sys.exit(EX_BROKEN_PIPE)
