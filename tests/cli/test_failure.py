"""The CLI boundary's classification and rendering: one line, the right code, no secret (the
traceback of the debug switch: tests/reliability/test_cli_errors.py)."""

from __future__ import annotations

import asyncio
import errno
import json

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lta_worker.cli._failure import DEBUG_HINT, classify, render
from lta_worker.errors import ConfigError, StorageError, UnknownKeyError, UsageError


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
