"""The CLI boundary: any exception becomes one line on stderr (an `error` JSON event or
`lta-worker: error: MESSAGE (HINT)`) and a documented exit code (docs/operations.md); an
exception group reports its most telling leaf.
"""

from __future__ import annotations

import errno
import json
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, TextIO

from lta_worker.errors import (
    EX_CONFIG,
    EX_TEMPFAIL,
    EX_USAGE,
    ConfigError,
    CursorError,
    EnrollmentError,
    KeyFileError,
    LtaError,
    NoDatabaseError,
    PassStoppedError,
    StorageError,
    UnknownUserError,
    UsageError,
)

DEBUG_HINT: Final = "a bug: rerun with --debug (or LTA_WORKER_DEBUG=1) for the traceback"
_MAX_MESSAGE: Final = 500
# The machine ran out of something, or a device failed: retry later (75).
_TEMPORARY_ERRNOS: Final = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EIO,
        errno.ENOMEM,
        errno.EMFILE,
        errno.ENFILE,
        errno.EAGAIN,
        errno.EINTR,
        errno.EBUSY,
        errno.ETXTBSY,
    }
)
# A path or a permission the operator configures (78).
_CONFIG_ERRNOS: Final = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
    }
)


@dataclass(frozen=True, slots=True)
class Failure:
    """What the boundary reports: one line's content and the exit code."""

    exit_code: int
    error: str
    message: str
    hint: str | None = None
    key: str | None = None

    def as_event(self) -> dict[str, object]:
        """The `error` log event (docs/log-events.md), before redaction."""
        event: dict[str, object] = {
            "error": self.error,
            "message": self.message,
            "exit_code": self.exit_code,
        }
        if self.hint:
            event["hint"] = self.hint
        if self.key:
            event["key"] = self.key
        event.update(
            event="error",
            level="error",
            ts=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            logger="lta_worker.cli",
        )
        return event


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside nested exception groups, depth first (or `exc` itself)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def _rank(exc: BaseException) -> int:
    """Lower is more telling: explained, machine, bug, then a task group's cancellations."""
    if isinstance(exc, LtaError):
        return 0
    if isinstance(exc, OSError) or _is_database_error(exc):
        return 1
    if isinstance(exc, Exception):
        return 2
    return 3


def telling_leaf(exc: BaseException) -> BaseException:
    """The leaf of an exception group that best explains the failure (first of the best)."""
    found = list(leaves(exc))
    return min(found, key=_rank) if found else exc


def one_line(text: str) -> str:
    """Collapse whitespace and newlines, and cap the length, so a message stays one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_MESSAGE else flat[: _MAX_MESSAGE - 3] + "..."


def _os_failure(exc: OSError) -> Failure:
    what = exc.strerror or type(exc).__name__
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in _TEMPORARY_ERRNOS:
        return Failure(
            EX_TEMPFAIL,
            type(exc).__name__,
            f"the system refused an operation: {what}{where}",
            "free disk space or other resources, then rerun; nothing was lost",
        )
    if exc.errno in _CONFIG_ERRNOS:
        return Failure(
            EX_CONFIG,
            type(exc).__name__,
            f"a file or directory cannot be used: {what}{where}",
            "check the paths in the configuration and the permissions of the user running "
            "lta-worker",
        )
    return Failure(
        EX_TEMPFAIL, type(exc).__name__, f"the system refused an operation: {what}{where}"
    )


def classify(exc: BaseException) -> Failure:
    """The Failure for an exception that reached the CLI boundary."""
    import click

    exc = telling_leaf(exc)
    if isinstance(exc, LtaError):
        key = exc.key if isinstance(exc, ConfigError) else None
        return Failure(exc.exit_code, type(exc).__name__, exc.message, hint_line(exc), key=key)
    if isinstance(exc, click.UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "lta-worker"
        return Failure(EX_USAGE, "UsageError", exc.format_message(), f"see `{command} --help`")
    if isinstance(exc, click.ClickException):
        return Failure(exc.exit_code or EX_USAGE, type(exc).__name__, exc.format_message())
    if _is_database_error(exc):  # escaped the storage layer's mapping: classified the same way
        from lta_worker.storage import map_driver_error

        return classify(map_driver_error(exc))  # type: ignore[arg-type]
    if isinstance(exc, OSError):
        return _os_failure(exc)
    message = f"unexpected {type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return Failure(1, type(exc).__name__, message, DEBUG_HINT)


def _is_database_error(exc: BaseException) -> bool:
    """True for a driver error or a pool timeout (`storage.DATABASE_ERRORS`)."""
    if "sqlalchemy" not in sys.modules:  # never imported: it cannot be one
        return False
    from lta_worker.storage import DATABASE_ERRORS

    return isinstance(exc, DATABASE_ERRORS)


def render(failure: Failure, *, as_json: bool) -> str:
    """The one line for `failure`, every known secret shape masked."""
    from lta_worker.logs import redact, scrub

    if as_json:
        event = redact(None, "error", failure.as_event())
        event["message"] = one_line(str(event["message"]))
        return json.dumps(event)  # ASCII, as the log lines: valid JSON on any stream
    text = f"{failure.message} ({failure.hint})" if failure.hint else failure.message
    return "lta-worker: error: " + one_line(scrub(text))


def wants_json(fmt: str | None, stream: TextIO) -> bool:
    """True when the error line must be JSON: format `json`, or `auto` off a terminal."""
    return fmt == "json" or (fmt != "console" and not stream.isatty())


def log_format(loaded: str | None, env: Mapping[str, str]) -> str | None:
    """The log format in force: the loaded settings', else `LTA_WORKER_LOG_FORMAT`."""
    if loaded is not None:
        return loaded
    value = env.get("LTA_WORKER_LOG_FORMAT", "").strip().lower()
    return value if value in {"auto", "json", "console"} else None


def report(
    exc: BaseException, *, fmt: str | None, debug: bool, stream: TextIO | None = None
) -> int:
    """Print `exc` as one line on `stream` (traceback first when `debug`); the exit code."""
    import os

    from lta_worker.logs import priority_prefix, scrub, stderr_is_journal

    stream = stream or sys.stderr
    failure = classify(exc)
    if debug:
        stream.write(scrub("".join(traceback.format_exception(exc))))
    prefix = priority_prefix("error") if stderr_is_journal(os.environ, stream) else ""
    stream.write(prefix + render(failure, as_json=wants_json(fmt, stream)) + "\n")
    stream.flush()
    return failure.exit_code


# -- the one table of operator hints: a structured error -> what to do, in our commands --
# Library errors say what happened (class, `reason`, fields); advice naming lta-worker's
# commands only makes sense here. A lookup walks the error's MRO, the entry for its
# `reason` first; an entry `None` stops the walk (a base's advice would mislead).

RESTART: Final = "start again with `lta-worker enroll url --user ID`"
_NEW_KEY_FILE: Final = "`(umask 077; lta-worker keys generate > FILE)`, then set crypto.key_file"
_APPEND_KEY: Final = "append a line from `lta-worker keys generate` to the key file"

HINTS: Final[Mapping[tuple[type[LtaError], str | None], str | None]] = {
    # Enrollment: a consent, its code and a user access token are short-lived and single
    # use, so nearly every failure is cured by a fresh consent.
    (EnrollmentError, None): RESTART,
    (EnrollmentError, "unreachable"): RESTART,
    (EnrollmentError, "token_refused"): RESTART,
    (EnrollmentError, "create_refused"): RESTART,
    (EnrollmentError, "service_failed"): RESTART + " in a while",
    (EnrollmentError, "no_token"): RESTART,
    (EnrollmentError, "no_scopes"): RESTART,
    (EnrollmentError, "unsendable_token"): (
        "the service's tokens cannot be sent in a header: report it to the service's operator"
    ),
    (EnrollmentError, "code_rejected"): RESTART,
    (EnrollmentError, "exchange_refused"): RESTART,
    (EnrollmentError, "no_access_token"): RESTART,
    (EnrollmentError, "consent_denied"): RESTART,
    (EnrollmentError, "consent_failed"): RESTART,
    # A new consent does not help: the client's settings or the operator's mode do.
    (EnrollmentError, "scope_refused"): None,
    (EnrollmentError, "client_rejected"): None,
    # `enroll finish` input that cannot finish any consent.
    (UsageError, "no_input"): RESTART,
    (UsageError, "no_pending_consent"): RESTART,
    (UsageError, "unknown_consent"): RESTART,
    (UsageError, "other_user_consent"): RESTART,
    (UnknownUserError, None): (
        "see `lta-worker users list`; enroll with `lta-worker enroll url --user ID`"
    ),
    # A feed cursor the database never issued: the way back, whatever the reason.
    **{
        (CursorError, reason): "`lta-worker results export --changed-since 0`"
        for reason in ("malformed", "legacy", "other_database", "ahead")
    },
    # A secret file this user may not read: most often root's 0600 file named in the
    # config while the unit runs as its DynamicUser.
    (ConfigError, "unreadable"): (
        "under systemd, leave the setting unset: the units pass /etc/lta-worker/client-secret, "
        "token-keys, webhook-secret and enroll-link-key with LoadCredential= "
        "(deploy/lta-worker.service) and the worker reads them in $CREDENTIALS_DIRECTORY; "
        "else make the file readable by the user lta-worker runs as (mode 0600 or 0400)"
    ),
    # The token key file.
    (ConfigError, "key_file_unset"): (
        "`lta-worker keys generate > FILE` (mode 0600), then set crypto.key_file"
    ),
    # A new key file only for a database without tokens: one under a key id the file had
    # needs that line back (the error's own hint names the ids), never a new key.
    (KeyFileError, "missing"): (
        "restore it if the database holds tokens (`lta-worker check` names the key ids it "
        "needs); for a new installation, " + _NEW_KEY_FILE
    ),
    (KeyFileError, "missing_empty"): _NEW_KEY_FILE,
    (KeyFileError, "missing_in_use"): None,
    (KeyFileError, "no_key"): _APPEND_KEY,
    (KeyFileError, "malformed"): _APPEND_KEY,
    (StorageError, "schema_outdated"): "run `lta-worker db upgrade`",
    (NoDatabaseError, None): "create it with `lta-worker db upgrade` (`run` and `serve` do too)",
    (PassStoppedError, "deadline"): "see the capacity in `lta-worker status`",
    (
        PassStoppedError,
        "breaker",
    ): "`lta-worker check` finds a wrong service.base_url path without spending a read",
}


def advice(exc: LtaError) -> str | None:
    """The CLI advice for `exc` (the module says how it is looked up); None without one."""
    for cls in type(exc).__mro__:
        if not issubclass(cls, LtaError):
            break
        for key in ((cls, exc.reason), (cls, None)):
            if key in HINTS:
                return HINTS[key]
    return None


def hint_line(exc: LtaError) -> str | None:
    """The hint the CLI shows for `exc`: the error's own hint, then the table's advice."""
    parts = [part for part in (exc.hint, advice(exc)) if part]
    return "; ".join(parts) or None
