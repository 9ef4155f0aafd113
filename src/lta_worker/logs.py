"""Structured logging: JSON lines for machines, a readable console for people, no secrets
(`redact`, last in the chain; tracebacks without frame locals). Inside a host application
(no `configure_logging`) events go to stdlib `logging` as redacted JSON. docs/log-events.md.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any, Final, Literal, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor, WrappedLogger

from lta_worker.protocol import TOKEN_PREFIX
from lta_worker.secret import Secret

REDACTED = "[redacted]"
_SECRET_KEYS = re.compile(
    r"(^|_)(token|secret|password|passwd|authorization|verifier|credential|"
    r"authorization_code|auth_code|key_material)$",
    re.IGNORECASE,
)
_PATTERNS = (
    re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9._~+/=-]*"),
    re.compile(r"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(?i)((?:code|code_verifier|client_secret|access_token|token)=)[^&\s'\"]+"),
)
_lock = threading.Lock()
# Insertion-ordered, bounded: the client secret stays, short-lived ones come and go.
_registered: dict[str, None] = {}
# Longest first: rebuilt on every change, read without the lock.
_by_length: tuple[str, ...] = ()
_MIN_REGISTERED = 6
_MAX_REGISTERED = 64
# True while `configure_logging` is in force (the CLI); else events go to stdlib `logging`.
_configured = False


def register_secret(value: str | Secret) -> None:
    """Mask this exact value wherever it appears in a log event from now on."""
    raw = value.reveal() if isinstance(value, Secret) else value
    if raw and len(raw) >= _MIN_REGISTERED:
        with _lock:
            _registered.pop(raw, None)
            _registered[raw] = None
            while len(_registered) > _MAX_REGISTERED:
                # Keep the first (the client secret); drop the oldest of the later ones.
                keys = iter(_registered)
                next(keys)
                del _registered[next(keys)]
            _sort_registered()


def _sort_registered() -> None:
    global _by_length  # noqa: PLW0603 - a snapshot swapped whole, read without the lock
    _by_length = tuple(sorted(_registered, key=len, reverse=True))


def forget_secrets() -> None:
    """Drop every registered value (tests; a key reload)."""
    with _lock:
        _registered.clear()
        _sort_registered()


def scrub(text: str) -> str:
    """Mask every known secret shape and registered value in a string."""
    for value in _by_length:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _PATTERNS[0].sub(REDACTED, text)
    text = _PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _PATTERNS[2].sub(lambda m: f"{m.group(1)}{REDACTED}", text)


def _scrub_value(key: str | None, value: Any) -> Any:
    if value is None or isinstance(value, int | float | bool):  # kept, whatever the name
        return value
    if isinstance(value, Secret):
        return REDACTED
    if key is not None and value != "" and _SECRET_KEYS.search(key):
        return REDACTED
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {k: _scrub_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub_value(None, v) for v in value]
    return scrub(str(value))


def redact(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask secrets in every field, nested ones included."""
    return {
        key: _scrub_value(key if key != "event" else None, value)
        for key, value in event_dict.items()
    }


def _drop_color_message(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    event_dict.pop("color_message", None)
    if "_logger" in event_dict:
        event_dict["logger"] = event_dict.pop("_logger")
    return event_dict


PRIORITIES = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


def stderr_is_journal(env: Mapping[str, str], stream: TextIO) -> bool:
    """True when `stream` is the journal's stream: `$JOURNAL_STREAM` is its `DEV:INODE`."""
    value = env.get("JOURNAL_STREAM", "")
    dev, sep, inode = value.partition(":")
    if not sep or not dev.isdigit() or not inode.isdigit():
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # no file behind it (a test's buffer)
        return False
    return (info.st_dev, info.st_ino) == (int(dev), int(inode))


def priority_prefix(level: str | None) -> str:
    """The `<N>` journald reads a line's priority from (info when the level is unknown)."""
    return f"<{PRIORITIES.get(str(level).lower(), 6)}>"


def _journal_renderer(renderer: Processor) -> Processor:

    def render(logger: WrappedLogger, method: str, event_dict: EventDict) -> Any:
        level = event_dict.get("level", method)
        return priority_prefix(level) + str(renderer(logger, method, event_dict))

    return render


def _read_level(level: int) -> Processor:
    """Log `poll.read` at debug: dropped unless the configured level is debug."""

    def demote(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
        if event_dict.get("event") == "poll.read":
            if level > logging.DEBUG:
                raise structlog.DropEvent
            event_dict["level"] = "debug"
        return event_dict

    return demote


# Tracebacks as data, without frame locals (they may hold secrets).
_EXCEPTION_DICT: Final = structlog.processors.ExceptionRenderer(
    ExceptionDictTransformer(show_locals=False)
)


def configure_logging(
    level: str = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
    stream: TextIO | None = None,
    *,
    read_level: str = "info",
    journal: bool = False,
) -> None:
    """Configure structlog once for the process: JSON lines unless the stream is a terminal
    (`fmt`); `read_level="debug"` logs `poll.read` at debug, `journal` prefixes priorities."""
    stream = stream or sys.stderr
    threshold = logging.getLevelNamesMapping()[level.upper()]
    use_console = fmt == "console" or (fmt == "auto" and stream.isatty())
    processors: list[Processor] = [structlog.contextvars.merge_contextvars, _drop_color_message]
    renderer: Processor = structlog.processors.JSONRenderer(sort_keys=False)
    exceptions: Processor = _EXCEPTION_DICT
    if use_console:
        renderer = structlog.dev.ConsoleRenderer(
            colors=stream.isatty() and not journal,
            exception_formatter=structlog.dev.plain_traceback,
        )
        exceptions = structlog.processors.format_exc_info
    processors += [
        exceptions,
        redact,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
    ]
    if read_level == "debug":
        processors.append(_read_level(threshold))
    processors.append(_journal_renderer(renderer) if journal else renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    global _configured  # noqa: PLW0603 - the one switch between the CLI's lines and a host's
    _configured = True


def reset_logging() -> None:
    """Undo `configure_logging` (tests)."""
    global _configured  # noqa: PLW0603
    _configured = False
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


class SecretFilter(logging.Filter):
    """A stdlib logging filter masking what `scrub` knows in a record's message (for a web
    server's access log: `logging.getLogger("uvicorn.access").addFilter(SecretFilter())`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record, its message masked and merged with its arguments."""
        record.msg, record.args = scrub(record.getMessage()), None
        return True


class _PackageLogger:
    """Follows `configure_logging` when in force, else writes redacted JSON to stdlib."""

    __slots__ = ("_proxy", "_stdlib")

    def __init__(self, name: str | None) -> None:
        initial: dict[str, Any] = {"_logger": name} if name else {}
        # `_logger`: `logger` is a parameter name of structlog's wrap_logger.
        self._proxy = structlog.get_logger(**initial)
        self._stdlib = structlog.wrap_logger(
            logging.getLogger(name or "lta_worker"),
            processors=[
                structlog.stdlib.filter_by_level,
                structlog.contextvars.merge_contextvars,
                _drop_color_message,
                _EXCEPTION_DICT,
                redact,
                structlog.processors.JSONRenderer(sort_keys=False),
            ],
            # Not stdlib's BoundLogger: its `exception` hands stdlib the traceback, which
            # stdlib would render unredacted; this one calls `error`.
            wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
            cache_logger_on_first_use=True,
            **initial,
        )

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._proxy if _configured else self._stdlib, attr)


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; `name` becomes the `logger` field."""
    return _PackageLogger(name)
