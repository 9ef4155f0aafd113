"""The one table of operator hints: a structured error -> what to do, in lta-worker's commands.

Library errors say what happened (class, `reason`, fields); advice naming our commands only
makes sense at this CLI, so it lives here and `_failure.classify` appends it. A lookup walks
the error's MRO, the entry for its `reason` first; an entry `None` stops the walk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from lta_worker.errors import (
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
    # The database.
    (StorageError, "schema_outdated"): "run `lta-worker db upgrade`",
    (NoDatabaseError, None): "create it with `lta-worker db upgrade` (`run` and `serve` do too)",
    # A pass that stopped early.
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
