"""The one exception tree of lta-worker.

Each error carries its exit code and a message that says what to do, never a secret. What
happened is data: the class, a machine `reason`, fields such as `key`; the `hint` speaks of
settings, files and the service, while advice naming lta-worker's commands lives in the
CLI's table (`cli/_failure.py`): a web application that imports this has no such commands.

    LtaError                      base; exit 1
    ├── UsageError                a command was given something it cannot use; exit 2
    │   ├── UnknownUserError      no such user in the database
    │   └── CursorError           a feed cursor this database never issued
    ├── ConfigError               the configuration is wrong; names the key; exit 78
    │   ├── KeyFileError          key file missing, unreadable, readable by others, or malformed
    │   └── UnknownKeyError       a stored token's key id is not in the key file
    ├── ModeNotOpenedError        invalid_scope: long term mode not opened on this client; exit 78
    ├── PassStoppedError          a pass stopped early (`reason`: its stop); exit 75 or 78
    ├── UpstreamError             the service is down or answers nonsense; exit 75
    │   └── EnrollmentError       consent, code exchange or token creation failed
    └── StorageError              the database refuses; exit 75
        ├── SchemaTooNewError     the database was migrated by a newer lta-worker; exit 78
        ├── SchemaOutdatedError   a read-only command found no schema or an older one; exit 78
        ├── NoDatabaseError       a read-only command found no database (no SQLite file); exit 78
        └── InstanceLockedError   another instance holds this SQLite database; exit 75
"""

from __future__ import annotations

EX_OK = 0
EX_UNHEALTHY = 1  # `status --check`: the worker is not healthy (also a bug's code)
EX_USAGE = 2
EX_TEMPFAIL = 75
EX_CONFIG = 78
EX_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
EX_BROKEN_PIPE = 141  # 128 + SIGPIPE: standard output's reader went away


class LtaError(Exception):
    """Root of every error lta-worker raises on purpose."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(LtaError):
    """A command was given an argument or input it cannot use."""

    exit_code = EX_USAGE


class UnknownUserError(UsageError):
    """The named user is not in the database."""

    def __init__(self, user: str) -> None:
        super().__init__(f"no user {user!r} in the database")
        self.user = user


class CursorError(UsageError):
    """A change feed cursor this database never issued: `reason` is `malformed`, `legacy`
    (a plain number of an older lta-worker), `other_database` (another database's, or from
    before a restore into another PostgreSQL cluster) or `ahead` (beyond what the database
    issued: forged, or from before a restore). The way back is to read again from `0`."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(
            message,
            hint="read the feed again from cursor 0 and take its rows as the whole truth",
            reason=reason,
        )


class ConfigError(LtaError):
    """The configuration is wrong; `key` names the setting (for example `poll.interval`)."""

    exit_code = EX_CONFIG

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        hint: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(f"{key}: {message}" if key else message, hint=hint, reason=reason)
        self.key = key


class KeyFileError(ConfigError):
    """The token key file is missing, unreadable, readable by others, or malformed."""


class UnknownKeyError(ConfigError):
    """A stored token was encrypted under a key id that the key file does not list."""

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"a stored token is encrypted under key id {key_id!r}, not listed in the key file",
            key="crypto.key_file",
            hint="restore that key line to the key file; nothing was modified or deleted",
        )
        self.key_id = key_id


class ModeNotOpenedError(LtaError):
    """The authorization server answered invalid_scope: long term mode is not on this client."""

    exit_code = EX_CONFIG


class PassStoppedError(LtaError):
    """A pass stopped before it read every due user; `reason` says why (`deadline`,
    `breaker`, ...) and the exit code is the stop's (75 the rest stays due, 78 configuration).
    """

    def __init__(self, message: str, *, exit_code: int, reason: str, hint: str | None = None):
        super().__init__(message, hint=hint, reason=reason)
        self.exit_code = exit_code


class UpstreamError(LtaError):
    """The service is unreachable or answers something unusable."""

    exit_code = EX_TEMPFAIL


class EnrollmentError(UpstreamError):
    """Consent, code exchange or token creation failed; `code` is the service's error code and
    `reason` what went wrong (`unreachable`, `token_refused`, `code_rejected`, ...)."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        hint: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(f"{message} [{code}]" if code else message, hint=hint, reason=reason)
        self.code = code


class StorageError(LtaError):
    """The database refused an operation."""

    exit_code = EX_TEMPFAIL


class SchemaTooNewError(StorageError):
    """The database schema is newer than this version of lta-worker knows."""

    exit_code = EX_CONFIG


class SchemaOutdatedError(StorageError):
    """No lta-worker schema, or an older one, for a command that may not migrate it."""

    exit_code = EX_CONFIG

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, reason="schema_outdated")


class NoDatabaseError(StorageError):
    """A read-only command found no database to read: a SQLite file never created."""

    exit_code = EX_CONFIG


class InstanceLockedError(StorageError):
    """Another lta-worker instance already works on this SQLite database."""
