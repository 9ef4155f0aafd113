"""Log rendering: JSON lines, no secrets, no frame locals in tracebacks."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path

import pytest

from lta_worker.logs import (
    SecretFilter,
    configure_logging,
    get_logger,
    register_secret,
    reset_logging,
    scrub,
)
from lta_worker.secret import Secret

TOKEN = "dspa_Z9yX8wV7uT6sR5qP4oN3mL2kJ1"
CLIENT_SECRET = "cs-0123456789abcdef"


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_event_level_and_timestamp(rendered_logs: io.StringIO) -> None:
    """A non-terminal stream gets one JSON object per event with event, level and ts."""
    get_logger("t").info("poll.read", user="u1", endpoint="stats", status=200)
    (line,) = lines(rendered_logs)
    assert line["event"] == "poll.read"
    assert line["level"] == "info"
    assert str(line["ts"]).endswith("Z")
    assert line["status"] == 200


def test_secrets_are_masked_in_every_field(rendered_logs: io.StringIO) -> None:
    """Tokens, bearer credentials, registered secrets and secret-named fields never render."""
    register_secret(CLIENT_SECRET)
    log = get_logger("t")
    log.info("x", message=f"Authorization: Bearer {TOKEN}.{CLIENT_SECRET}")
    log.info("x", nested={"deep": [f"oops {CLIENT_SECRET}"]}, token="abc", code_verifier="v" * 43)
    log.info("x", wrapped=Secret("plain-secret-1"), url="https://x/cb?code=AUTHCODE1234&state=s")
    out = rendered_logs.getvalue()
    for leaked in (TOKEN, CLIENT_SECRET, "abc", "v" * 43, "plain-secret-1", "AUTHCODE1234"):
        assert leaked not in out


def test_what_holds_no_secret_is_kept(rendered_logs: io.StringIO) -> None:
    """Counts, None and "" under secret names, and error codes under `code`, stay unmasked."""
    get_logger("t").info("x", token=3, client_secret=None, password="", auth_code=1.5)
    get_logger("t").info("x", token=["a"], secret={"k": 1})
    get_logger("t").info("poll.read", code="PermanentAccessRevoked", error_code="invalid_scope")
    first, second, third = lines(rendered_logs)
    assert (first["token"], first["client_secret"], first["password"]) == (3, None, "")
    assert first["auth_code"] == 1.5
    assert (second["token"], second["secret"]) == ("[redacted]", "[redacted]")
    assert (third["code"], third["error_code"]) == ("PermanentAccessRevoked", "invalid_scope")


def test_tracebacks_render_without_frame_locals(rendered_logs: io.StringIO) -> None:
    """An exception logged with a token in a local variable shows frames, not locals."""

    def fail() -> None:
        credential = f"{TOKEN}.{CLIENT_SECRET}"  # a local that must never be rendered
        raise RuntimeError("read failed for " + credential[:0])

    register_secret(CLIENT_SECRET)
    try:
        fail()
    except RuntimeError:
        get_logger("t").exception("error")
    out = rendered_logs.getvalue()
    assert "RuntimeError" in out
    assert TOKEN not in out and CLIENT_SECRET not in out
    (line,) = lines(rendered_logs)
    frames = line["exception"][0]["frames"]  # type: ignore[index]
    assert all("locals" not in frame for frame in frames)


def test_scrub_masks_query_parameters_and_tokens() -> None:
    """scrub() masks codes in URLs and any dspa_ token in free text."""
    text = scrub(f"GET /cb?code=abc123&state=xyz token {TOKEN}")
    assert "abc123" not in text and TOKEN not in text and "state=xyz" in text


def test_module_level_loggers_follow_later_configuration() -> None:
    """A logger made at import time renders with the configuration applied afterwards."""
    early = get_logger("early")
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    early.info("pass.started", due=3)
    (line,) = lines(stream)
    assert line["event"] == "pass.started"
    assert line["logger"] == "early"


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("info", ["pass.finished", "user.state_changed"]),
        ("debug", ["poll.read", "pass.finished", "user.state_changed"]),
    ],
)
def test_read_level_debug_turns_poll_read_down_alone(level: str, shown: list[str]) -> None:
    """`read_level = "debug"` logs `poll.read` alone at debug; the others stay at info."""
    stream = io.StringIO()
    configure_logging(level, "json", stream, read_level="debug")
    log = get_logger("t")
    log.info("poll.read", user="u1")
    log.info("pass.finished", reads=1)
    log.info("user.state_changed", user="u1")
    events = lines(stream)
    assert [e["event"] for e in events] == shown
    levels = {e["event"]: e["level"] for e in events}
    assert levels.get("poll.read", "debug") == "debug"
    assert levels["pass.finished"] == "info"


def test_journal_lines_carry_their_priority() -> None:
    """With `journal`, each JSON line starts with its syslog priority (<3> error .. <7> debug)."""
    stream = io.StringIO()
    configure_logging("debug", "json", stream, journal=True)
    log = get_logger("t")
    log.error("a")
    log.warning("b")
    log.info("c")
    log.debug("d")
    out = stream.getvalue().splitlines()
    assert [line[:3] for line in out] == ["<3>", "<4>", "<6>", "<7>"]
    assert [json.loads(line[3:])["event"] for line in out] == ["a", "b", "c", "d"]


def test_stderr_is_journal_compares_device_and_inode(tmp_path: Path) -> None:
    """`$JOURNAL_STREAM` naming the stream's own DEV:INODE is the journal, nothing else is."""
    from lta_worker.logs import stderr_is_journal

    target, other = tmp_path / "a", tmp_path / "b"
    with target.open("w") as stream, other.open("w") as elsewhere:
        info = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}
        assert stderr_is_journal(env, stream) is True
        assert stderr_is_journal(env, elsewhere) is False
        assert stderr_is_journal({"JOURNAL_STREAM": "x:y"}, stream) is False
        assert stderr_is_journal({}, stream) is False
        assert stderr_is_journal(env, io.StringIO()) is False


def test_inside_a_host_the_events_reach_stdlib_logging_redacted() -> None:
    """In a host that set structlog up its own way, events reach stdlib logging masked."""
    import structlog

    reset_logging()
    structlog.configure(processors=[structlog.processors.KeyValueRenderer()])  # the host's
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("lta_worker")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        register_secret(CLIENT_SECRET)
        log = get_logger("lta_worker.enroll")
        log.warning("enroll.failed", note=f"with {CLIENT_SECRET}", token="abc-123-def")
        try:
            raise ValueError(f"boom {TOKEN} {CLIENT_SECRET}")
        except ValueError:
            log.exception("pass.crashed", url="https://app.example/cb?code=c0de-c0de&state=s")
        log.debug("poll.read")  # below the host's level: never rendered
    finally:
        root.removeHandler(handler)
        root.setLevel(logging.NOTSET)
        structlog.reset_defaults()
    text = stream.getvalue()
    assert [line.split(" ", 2)[:2] for line in text.splitlines()] == [
        ["WARNING", "lta_worker.enroll"],
        ["ERROR", "lta_worker.enroll"],
    ]
    first = json.loads(text.splitlines()[0].split(" ", 2)[2])
    assert (first["event"], first["logger"]) == ("enroll.failed", "lta_worker.enroll")
    for secret in (CLIENT_SECRET, "abc-123-def", TOKEN, "c0de-c0de"):
        assert secret not in text
    assert "poll.read" not in text


def test_secret_filter_masks_the_code_in_an_access_log_line() -> None:
    """`SecretFilter` on a web server's access logger masks the callback's `?code=`."""
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s"',
        ("1.2.3.4", "GET", "/lta/callback?code=SplxlOBeZQQYbYS6WxSbIA&state=xyz"),
        None,
    )
    assert SecretFilter().filter(record)
    assert record.getMessage() == '1.2.3.4 - "GET /lta/callback?code=[redacted]&state=xyz"'
