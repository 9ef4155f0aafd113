"""The CLI boundary: classification and rendering (one line, the right code, no secret; the
traceback of the debug switch: tests/reliability/test_cli_errors.py), the one table of operator
hints (`cli/_failure.py`): structured errors -> CLI advice, and no CLI advice anywhere a web
application imports."""

from __future__ import annotations

import ast
import asyncio
import errno
import json
import re
from pathlib import Path

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout

import lta_worker
from lta_worker import errors
from lta_worker.cli import _commands as commands
from lta_worker.cli._failure import DEBUG_HINT, HINTS, RESTART, advice, classify, hint_line, render
from lta_worker.errors import (
    ConfigError,
    CursorError,
    EnrollmentError,
    KeyFileError,
    LtaError,
    ModeNotOpenedError,
    NoDatabaseError,
    PassStoppedError,
    StorageError,
    UnknownKeyError,
    UnknownUserError,
    UsageError,
)
from lta_worker.storage import load_key_file
from lta_worker.upstream import create_reason, exchange_reason
from support.process import write_private

PACKAGE = Path(lta_worker.__file__).parent
# The operator's own code: the CLI, the narrated demo, and the simulator's stand-in service.
CLI_SIDE = ("cli/", "simulator/")
# Text that names a command to describe a situation, not to advise one: (module, text).
DESCRIPTIONS = {("storage/_store.py", "another lta-worker run or serve is already working on ")}
USERS = "see `lta-worker users list`; enroll with `lta-worker enroll url --user ID`"
UNREADABLE = HINTS[(ConfigError, "unreadable")]  # the key file: the rule for every file
MAKE_KEY = "`(umask 077; lta-worker keys generate > FILE)`, then set crypto.key_file"
RESTORE_OR_MAKE_KEY = (
    "restore it if the database holds tokens (`lta-worker check` names the key ids it needs); "
    "for a new installation, " + MAKE_KEY
)
APPEND_KEY = "append a line from `lta-worker keys generate` to the key file"


def _library_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith(CLI_SIDE)
    ]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or bare string statements."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.add(id(node.value))
    return found


def _advice_in(path: Path, pattern: re.Pattern[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and pattern.search(node.value)
    ]


def _command_pattern() -> re.Pattern[str]:
    words = sorted(commands.COMMANDS)
    assert {"enroll", "db", "keys", "users", "run"} <= set(words)
    return re.compile(r"lta-worker (?:" + "|".join(map(re.escape, words)) + r")\b")


def test_no_cli_advice_outside_the_cli() -> None:
    """No constant outside the CLI, demo and simulator names an `lta-worker COMMAND`."""
    pattern = _command_pattern()
    found = {
        (path.relative_to(PACKAGE).as_posix(), text)
        for path in _library_modules()
        for text in _advice_in(path, pattern)
    }
    assert found - DESCRIPTIONS == set()
    assert found >= DESCRIPTIONS, "a described situation is gone: drop it from DESCRIPTIONS"


def test_the_scan_sees_advice(tmp_path: Path) -> None:
    """The scan flags a message naming a command, and ignores the same text in a docstring."""
    path = tmp_path / "m.py"
    path.write_text(
        '"""Run `lta-worker db upgrade`."""\n'
        'def f():\n    """`lta-worker keys generate`."""\n'
        '    raise ValueError("bad", hint="run `lta-worker db upgrade`")\n'
    )
    assert _advice_in(path, _command_pattern()) == ["run `lta-worker db upgrade`"]


def _reasons_in_source() -> set[tuple[str, str]]:
    """(callee name, reason) of every call in the package that passes a literal `reason=` to
    an LtaError class, or to `error` (a ConfigError class passed as a value)."""
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else ""
            cls = getattr(errors, name, None)
            is_error = isinstance(cls, type) and issubclass(cls, LtaError)
            if not (is_error or name == "error"):
                continue
            for keyword in node.keywords:
                if keyword.arg == "reason" and isinstance(keyword.value, ast.Constant):
                    found.add((name, str(keyword.value.value)))
    return found


def test_every_literal_reason_has_an_entry() -> None:
    """Each literal `reason=` has its own row in the hints table (advice or None)."""
    found = _reasons_in_source()
    assert len(found) >= 10, found
    reasons_in_table = {reason for _, reason in HINTS}
    for name, reason in found:
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, LtaError):
            rows = [(base, reason) for base in cls.__mro__ if (base, reason) in HINTS]
            assert rows, (name, reason)
        else:  # a class passed as a value (`secret_file`'s `error`)
            assert reason in reasons_in_table, (name, reason)


REFUSALS = [create_reason(status) for status in (400, 401, 403, 404, 409, 429, 500, 502, 503)]
REFUSALS += [exchange_reason(error) for error in (None, "invalid_grant", "invalid_client")]
REFUSALS += [exchange_reason(error) for error in ("unauthorized_client", "invalid_request")]


@pytest.mark.parametrize("reason", REFUSALS)
def test_every_refusal_reason_has_an_entry(reason: str) -> None:
    """Each reason a refused token creation or code exchange can carry has its own row."""
    assert (EnrollmentError, reason) in HINTS


# (error, the CLI's hint): the rendered advice of today's messages, row by row.
CASES: list[tuple[LtaError, str | None]] = [
    (EnrollmentError("x", reason="unreachable", hint="user access tokens are short-lived"),
     "user access tokens are short-lived; " + RESTART),
    (EnrollmentError("x", reason="service_failed", hint="the service failed"),
     "the service failed; " + RESTART + " in a while"),
    # An error's hint, then the advice to start the enrollment again.
    *[(EnrollmentError("x", reason=reason, hint="check"), "check; " + RESTART)
      for reason in ("token_refused", "no_token", "no_scopes", "code_rejected", "no_access_token")],
    # No hint of its own: the advice alone.
    *[(EnrollmentError("x", reason=reason), RESTART)
      for reason in ("unreachable", "create_refused", "exchange_refused", "consent_denied",
                     "consent_failed", None)],
    *[(UsageError("x", reason=reason), RESTART)
      for reason in ("no_input", "no_pending_consent", "unknown_consent", "other_user_consent")],
    (
        EnrollmentError("x", reason="unsendable_token"),
        "the service's tokens cannot be sent in a header: report it to the service's operator",
    ),
    (EnrollmentError("x", reason="scope_refused", hint="ask the operator"), "ask the operator"),
    (EnrollmentError("x", reason="client_rejected", hint="check client.id"), "check client.id"),
    (UnknownUserError("bob"), USERS),
    (ConfigError("x", key="crypto.key_file", reason="key_file_unset"),
     "`lta-worker keys generate > FILE` (mode 0600), then set crypto.key_file"),
    (KeyFileError("x", key="crypto.key_file", reason="missing"), RESTORE_OR_MAKE_KEY),
    (KeyFileError("x", key="crypto.key_file", reason="missing_empty"), MAKE_KEY),
    (KeyFileError("x", key="crypto.key_file", reason="missing_in_use", hint="restore"), "restore"),
    (KeyFileError("x", key="crypto.key_file", reason="no_key"), APPEND_KEY),
    (KeyFileError("x", key="crypto.key_file", reason="malformed"), APPEND_KEY),
    (StorageError("x", reason="schema_outdated"), "run `lta-worker db upgrade`"),
    (NoDatabaseError("x"), "create it with `lta-worker db upgrade` (`run` and `serve` do too)"),
    (KeyFileError("x", key="crypto.key_file", reason="unreadable"), UNREADABLE),
    *[
        (
            CursorError("x", reason=reason),
            "read the feed again from cursor 0 and take its rows as the whole truth; "
            "`lta-worker results export --changed-since 0`",
        )
        for reason in ("malformed", "legacy", "other_database", "ahead")
    ],
    (
        PassStoppedError("x", exit_code=75, reason="deadline"),
        "see the capacity in `lta-worker status`",
    ),
    (
        PassStoppedError("x", exit_code=78, reason="breaker"),
        "`lta-worker check` finds a wrong service.base_url path without spending a read",
    ),
    # No row: the error's own hint only.
    (StorageError("x", hint="retry"), "retry"),
    (UnknownKeyError("k1"),
     "restore that key line to the key file; nothing was modified or deleted"),
    (ModeNotOpenedError("x", hint="ask"), "ask"),
    (UsageError("x"), None),
    (KeyFileError("x", key="crypto.key_file", hint="chmod 600 f"), "chmod 600 f"),
]  # fmt: skip


@pytest.mark.parametrize(("exc", "expected"), CASES)
def test_the_cli_hint_of_each_error(exc: LtaError, expected: str | None) -> None:
    """An error's CLI hint is its own, else the table's for its class and reason."""
    assert hint_line(exc) == expected
    assert classify(exc).hint == expected
    if expected:
        assert render(classify(exc), as_json=False).endswith(f"({expected})")


def _row(exc: LtaError) -> tuple[type, str | None] | None:
    """The table's row that `advice` answers `exc` from."""
    for cls in type(exc).__mro__:
        for key in ((cls, exc.reason), (cls, None)):
            if key in HINTS:
                return key
    return None


def test_every_row_is_exercised() -> None:
    """Every row of the table answers a case above, so the table holds no dead advice."""
    assert set(HINTS) == {_row(exc) for exc, _ in CASES} - {None}


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (EnrollmentError("x", reason="a_reason_nobody_wrote"), RESTART),
        (KeyFileError("x", reason="a_reason_nobody_wrote"), None),
        (UsageError("x", reason="a_reason_nobody_wrote"), None),
        (LtaError("x", reason="missing"), None),
    ],
)
def test_an_unknown_reason_falls_back_to_the_class(exc: LtaError, expected: str | None) -> None:
    """A reason without a row takes its class's advice (the nearest along the MRO), or none."""
    assert advice(exc) == expected


def test_library_errors_carry_no_cli_advice(tmp_path: Path) -> None:
    """Library errors carry no command; the CLI's line still says which command helps."""
    with pytest.raises(KeyFileError) as missing:
        load_key_file(tmp_path / "nope")
    with pytest.raises(KeyFileError) as empty:
        load_key_file(write_private(tmp_path / "empty", "# nothing\n"))
    for info, expected in ((missing, RESTORE_OR_MAKE_KEY), (empty, APPEND_KEY)):
        assert "lta-worker" not in str(info.value)
        assert classify(info.value).hint == expected
    assert "lta-worker" not in str(UnknownUserError("bob"))


@pytest.mark.parametrize(
    ("exc", "exit_code", "error"),
    [
        (UnknownKeyError("k-lost"), 78, "UnknownKeyError"),
        (ExceptionGroup("g", [UnknownKeyError("k-lost")]), 78, "UnknownKeyError"),
        (
            BaseExceptionGroup("g", [asyncio.CancelledError(), StorageError("down")]),
            75,
            "StorageError",
        ),
        (
            ExceptionGroup("out", [ExceptionGroup("in", [RuntimeError("x"), UsageError("u")])]),
            2,
            "UsageError",
        ),
        (OSError(errno.ENOSPC, "No space left on device", "/var/lib/x"), 75, "OSError"),
        (OSError(errno.EFBIG, "File too large"), 75, "OSError"),
        (PermissionError(errno.EACCES, "Permission denied", "/etc/x"), 78, "PermissionError"),
        (OSError(errno.EROFS, "Read-only file system"), 78, "OSError"),
        (OSError(errno.ECONNRESET, "reset"), 75, "ConnectionResetError"),
        (ExceptionGroup("g", [OSError(errno.ENOSPC, "full"), KeyError("k")]), 75, "OSError"),
        (PoolTimeout("QueuePool limit"), 75, "StorageError"),
        (ExceptionGroup("g", [KeyError("k"), PoolTimeout("QueuePool limit")]), 75, "StorageError"),
        (RuntimeError("boom"), 1, "RuntimeError"),
        (ExceptionGroup("g", [TypeError("t")]), 1, "TypeError"),
    ],
)
def test_classify_picks_the_telling_leaf_and_its_code(
    exc: BaseException, exit_code: int, error: str
) -> None:
    """Nested groups resolve to their most telling leaf, with the documented exit code."""
    failure = classify(exc)
    assert (failure.exit_code, failure.error) == (exit_code, error)
    assert (failure.hint == DEBUG_HINT) == (exit_code == 1)


def test_json_line_is_one_error_event_with_key_and_hint() -> None:
    """JSON rendering: one `error` line with level, exit_code, key and hint, secrets masked."""
    exc = ConfigError("bad value 'dspa_SECRETSECRET'\nsecond line", key="poll.interval", hint="h")
    line = render(classify(exc), as_json=True)
    assert "\n" not in line
    event = json.loads(line)
    assert (event["event"], event["level"], event["exit_code"]) == ("error", "error", 78)
    assert event["key"] == "poll.interval" and event["hint"] == "h"
    assert "dspa_SECRET" not in line and "second line" in event["message"]


def test_console_line_is_one_line_with_the_hint() -> None:
    """Console rendering: `lta-worker: error: MESSAGE (HINT)` on one line, secrets masked."""
    line = render(classify(StorageError("a\nb Bearer abcdef123", hint="rerun")), as_json=False)
    assert line == "lta-worker: error: a b Bearer [redacted] (rerun)"
