"""Bad input: Hypothesis fuzzes the RateLimit parser, the pacer and the classifier with hostile
values; broken configurations through `lta-worker run` (in-process `main`) exit 78 in one line
naming the key; a database from a newer schema is refused by every command and left unchanged."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lta_worker.config import RateLimitSettings
from lta_worker.domain import OUTCOME_KINDS, Answer, classify
from lta_worker.pacing import PacerCore, RateLimitInfo, wait_after_429
from lta_worker.pacing._ratelimit import parse_answer, parse_ratelimit
from lta_worker.pacing._window import DEFAULT_MAX_WAIT, MIN_429_WAIT, trusted_wait
from lta_worker.storage import generate_key_line
from support.process import Output, render_toml, run_here, write_private

EXAMPLES_IN_CI = 250
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)

# -- fuzzing -------------------------------------------------------------------------------

FIELD_NAMES = [
    "RateLimit",
    "ratelimit",
    "RateLimit-Policy",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "ratelimit-reset-after",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "x-ratelimit-reset-after",
    "X-RateLimit-Policy",
    "Retry-After",
    "Date",
    "WWW-Authenticate",
]
FRAGMENTS = [
    '"default"',
    '"p"',
    "default",
    ";",
    ",",
    " ",
    "=",
    '"',
    "r=",
    "t=",
    "q=",
    "w=",
    "pk=",
    "limit=",
    "remaining=",
    "reset=",
    "0",
    "-1",
    "1.5",
    "3600",
    "1700000000",
    "1700000000000",
    "99999999999999999999",
    "1e309",
    "NaN",
    "inf",
    "?1",
    "?0",
    ":YWJj:",
    "@1700000000",
    "%22",
    "Sun, 06 Nov 1994 08:49:37 GMT",
    "Mon, 32 Foo 9999 99:99:99 GMT",
    'Bearer error="PermanentAccessRevoked"',
    "error=invalid_token",
    "\x00",
    "\u00e9",
    "\ud800",
    "\t",
    "(",
    ")",
    "*",
]
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
field_values = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), numbers, st.text(max_size=6)), max_size=12
).map("".join)
header_maps = st.dictionaries(
    st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=12)), field_values, max_size=6
)
moments = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(1970, 1, 2),
        max_value=datetime(9000, 1, 1),
        timezones=st.sampled_from([UTC, None]),  # naive ones too
    ),
)


def _examples(iterations: float) -> int:
    return round(EXAMPLES_IN_CI * iterations)


def _fuzz(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _finite_or_none(value: float | None) -> bool:
    return value is None or (math.isfinite(value) and value >= 0)


def test_ratelimit_parser_never_raises(iterations: float) -> None:
    """Hostile headers: parsing never raises; figures are finite, >= 0, waits capped at max_wait."""

    @_fuzz(_examples(iterations))
    @given(headers=header_maps, now=moments)
    def check(headers: dict[str, str], now: datetime | None) -> None:
        info = parse_ratelimit(headers, now)
        parse_answer(headers, now)  # the Date read too
        if info is None:
            return
        assert isinstance(info, RateLimitInfo)
        for count in (info.limit, info.remaining):
            assert count is None or (isinstance(count, int) and count >= 0)
        for seconds in (info.reset_after, info.window):
            assert _finite_or_none(seconds), info
        for wait in (info.retry_after, info.wait):
            assert wait == math.inf or _finite_or_none(wait), info
        assert _finite_or_none(trusted_wait(info.wait, DEFAULT_MAX_WAIT)), info

    check()


def test_pacer_survives_any_parsed_headers(iterations: float) -> None:
    """200 sequences of hostile answers fed to the pacer's core: no exception, and the next
    permit's delay is always a finite number of seconds, never negative."""
    steps = st.lists(
        st.tuples(
            header_maps,
            st.sampled_from([None, 200, 401, 404, 429, 500, 503]),
            st.floats(min_value=0.0, max_value=5000.0),
        ),
        min_size=1,
        max_size=8,
    )

    @_fuzz(_examples(iterations) // 5)
    @given(answers=steps)
    def check(answers: list[tuple[dict[str, str], int | None, float]]) -> None:
        core = PacerCore(RateLimitSettings(reserve=0.1, fallback_per_hour=60.0), initial_burst=5)
        now = 1000.0
        for headers, status, gap in answers:
            now += gap
            sent = now - 0.01
            core.reserve(sent)
            core.observe(now, parse_ratelimit(headers, NOW), status, sent_at=sent)
            delay, _ = core.delay(now)
            assert math.isfinite(delay) and delay >= 0, (delay, headers, status)
            assert math.isfinite(core.paused_for(now))

    check()


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.sampled_from(
        [
            "PermanentAccessRevoked",
            "permanent_access_revoked",
            "NoCloudSyncLinked",
            "CloudSyncInactive",
            "https://errors.example/PermanentAccessRevoked",
            "about:blank",
            "dspa_" + "k" * 40,
            "invalid_token",
        ]
    ),
)
ERROR_KEYS = "error code errorCode error_code errors type title detail details message ERROR x"
json_docs = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.sampled_from(ERROR_KEYS.split()), children, max_size=5)
    ),
    max_leaves=20,
)
PATHOLOGICAL = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"1" * 5000,
    b'{"n": ' + b"9" * 5000 + b"}",
    b"NaN",
    b'{"x": Infinity}',
    b'"\\ud800"',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe\x00{",
    b'{"error": "\\u0000PermanentAccessRevoked"}',
    b"",
]
bodies = st.one_of(
    st.binary(max_size=400),
    json_docs.map(lambda v: json.dumps(v).encode()),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from(PATHOLOGICAL),
)
answers = st.builds(
    Answer,
    status=st.one_of(st.none(), st.integers(min_value=-(10**6), max_value=10**6)),
    headers=header_maps.map(lambda h: {k.lower(): v for k, v in h.items()}),
    body=bodies,
    error=st.one_of(st.none(), st.text(max_size=30)),
    truncated=st.booleans(),
    elapsed=st.floats(allow_nan=True, allow_infinity=True),
)


def test_classifier_never_raises(iterations: float) -> None:
    """Hostile answers: classify never raises, 429 waits are bounded, no `dspa_` in reason/code."""

    @_fuzz(_examples(iterations))
    @given(answer=answers, endpoint=st.sampled_from(["latest-change", "stats"]), now=moments)
    def check(answer: Answer, endpoint: Any, now: datetime | None) -> None:
        outcome = classify(endpoint, answer)
        assert outcome.kind in OUTCOME_KINDS
        if outcome.kind == "rate_limited":
            wait = wait_after_429(answer.headers, now)
            assert MIN_429_WAIT <= wait <= DEFAULT_MAX_WAIT
        for text in (outcome.reason, outcome.code):
            assert text is None or "dspa" not in text.lower()

    check()


def test_pathological_bodies_classify_quickly() -> None:
    """The worst bodies (100,000-deep nesting, 5,000-digit numbers, NaN, lone surrogates)
    classify as a transient or an error outcome, each well under a second."""
    import time

    for body in PATHOLOGICAL:
        for status in (200, 401, 403, 429, 500):
            started = time.perf_counter()
            outcome = classify("stats", Answer(status=status, body=body))
            assert time.perf_counter() - started < 1.0, (body[:20], status)
            if status == 200 and body not in (b"1" * 5000,):
                assert outcome.kind in {"transient", "ok"}


# -- broken configurations through the real CLI ----------------------------------------------

Sections = dict[str, dict[str, Any]]


def _valid(tmp: Path) -> Sections:
    """A configuration that `run` accepts (the service is never reached in these tests)."""
    secret = write_private(tmp / "client-secret", "a-client-secret\n")
    keys = write_private(tmp / "token-keys", generate_key_line(NOW) + "\n")
    return {
        "service": {"base_url": "http://127.0.0.1:9", "auth_url": "http://127.0.0.1:9/auth"},
        "client": {"id": "client", "secret_file": str(secret)},
        "database": {"url": f"sqlite:///{tmp / 'lta.db'}"},
        "crypto": {"key_file": str(keys)},
        "log": {"format": "json"},
    }


def _set(section: str, key: str, value: Any) -> Callable[[Sections, Path], None]:
    def change(data: Sections, _: Path) -> None:
        data.setdefault(section, {})[key] = value

    return change


def _drop(section: str, key: str) -> Callable[[Sections, Path], None]:
    def change(data: Sections, _: Path) -> None:
        data[section].pop(key, None)

    return change


def _key_file(text: str, mode: int = 0o600) -> Callable[[Sections, Path], None]:
    def change(data: Sections, tmp: Path) -> None:
        path = tmp / "token-keys"
        path.write_text(text, encoding="utf-8")
        path.chmod(mode)

    return change


def _secret_file(text: str) -> Callable[[Sections, Path], None]:
    def change(data: Sections, tmp: Path) -> None:
        write_private(tmp / "client-secret", text)

    return change


def _secret_bytes(content: bytes, mode: int = 0o600) -> Callable[[Sections, Path], None]:
    def change(data: Sections, tmp: Path) -> None:
        path = tmp / "client-secret"
        path.write_bytes(content)
        path.chmod(mode)

    return change


def _fifo(section: str, key: str) -> Callable[[Sections, Path], None]:
    """The setting names a FIFO (mode 0600) that no one ever writes: reading would block."""

    def change(data: Sections, tmp: Path) -> None:
        fifo = tmp / f"fifo-{key}"
        os.mkfifo(fifo, 0o600)
        data[section][key] = str(fifo)

    return change


def _key_mode(mode: int) -> Callable[[Sections, Path], None]:
    def change(data: Sections, tmp: Path) -> None:
        (tmp / "token-keys").chmod(mode)

    return change


def _missing(section: str, key: str) -> Callable[[Sections, Path], None]:
    return _set(section, key, "/nonexistent/lta-worker/file")


# (name, change to the valid config, environment, text the message must contain)
# (name, change to the valid config, environment, text the message must contain); each other
# setting's refusal at load: tests/config/test_settings.py (the same path to this line).
BROKEN: list[tuple[str, Callable[[Sections, Path], None], dict[str, str], str]] = [
    ("poll.interval not a duration", _set("poll", "interval", "soon"), {}, "poll.interval"),
    (
        "environment override unknown key",
        lambda data, tmp: None,
        {"LTA_WORKER_POLL_SPEED": "fast"},
        "poll.speed",
    ),
    ("secret file empty", _secret_file("\n"), {}, "client.secret_file"),
    ("no secret file configured", _drop("client", "secret_file"), {}, "client.secret_file"),
    ("key file missing", _missing("crypto", "key_file"), {}, "crypto.key_file"),
    ("key file mode 0644", _key_mode(0o644), {}, "crypto.key_file"),
    ("key file mode 0640", _key_mode(0o640), {}, "chmod 600"),
    ("key file a FIFO", _fifo("crypto", "key_file"), {}, "crypto.key_file"),
    ("key file with a BOM", _key_file("\ufeff" + generate_key_line(NOW) + "\n"), {}, "BOM"),
    ("secret file with a BOM", _secret_bytes(b"\xef\xbb\xbfa-client-secret\n"), {}, "BOM"),
    ("secret file non-ASCII", _secret_bytes("a-cl\u00efent\n".encode()), {}, "client.secret_file"),
    ("secret file not UTF-8", _secret_bytes(b"a-\xff-secret\n"), {}, "client.secret_file"),
    ("secret file on two lines", _secret_file("a-secret\nsecond line\n"), {}, "client.secret_file"),
    ("secret file mode 0644", _secret_bytes(b"a-client-secret\n", 0o644), {}, "chmod 600"),
    ("secret file a FIFO", _fifo("client", "secret_file"), {}, "client.secret_file"),
    ("secret file a directory", _set("client", "secret_file", "/"), {}, "client.secret_file"),
    ("key file with no key", _key_file("# nothing\n"), {}, "crypto.key_file"),
    ("no key file configured", _drop("crypto", "key_file"), {}, "crypto.key_file"),
]


def _run_broken(
    root: Path, name: str, change: Callable[[Sections, Path], None], env: dict[str, str]
) -> Output:
    """`lta-worker run` in-process on the valid configuration changed by `change`."""
    tmp = root / name.replace(" ", "-").replace("/", "-")
    tmp.mkdir()
    data = _valid(tmp)
    change(data, tmp)
    config = tmp / "lta-worker.toml"
    config.write_text(render_toml(data), encoding="utf-8")
    return run_here(["--config", str(config), "run"], env=env)


@pytest.mark.parametrize(("name", "expected"), [(b[0], b[3]) for b in BROKEN])
def test_broken_config_exits_78_naming_the_key(tmp_path: Path, name: str, expected: str) -> None:
    """`lta-worker run` with a broken configuration (JSON log mode): exit 78, nothing on stdout,
    no traceback, and stderr is exactly one line: a JSON `error` event naming the key."""
    (_, change, env, _) = next(b for b in BROKEN if b[0] == name)
    done = _run_broken(tmp_path, name, change, env)
    assert done.returncode == 78, (done.returncode, done.stderr[-2000:])
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    error = json.loads(lines[0])
    assert (error["event"], error["level"], error["exit_code"]) == ("error", "error", 78)
    assert expected in error["message"] + error.get("hint", ""), error


def test_valid_config_is_accepted(tmp_path: Path) -> None:
    """The matrix's base configuration is valid: `run` gets past configuration to the
    unreachable service (exit 0 with no user due), so each broken case fails for its key."""
    done = _run_broken(tmp_path, "valid", lambda data, tmp: None, {})
    assert done.returncode == 0, done.stderr[-2000:]


# -- a database from a newer lta-worker --------------------------------------------------------


def _fingerprint(database: Path) -> str:
    """A digest of every row of every table (the file itself may be checkpointed)."""
    digest = hashlib.sha256()
    with sqlite3.connect(database) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in sorted(tables):
            digest.update(table.encode())
            for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY 1'):  # noqa: S608
                digest.update(repr(row).encode())
    conn.close()
    return digest.hexdigest()


def test_database_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A database stamped with an unknown (future) revision: run, serve, db upgrade, status
    and users list each exit 78 saying the schema is newer, and nothing in it changes."""
    data = _valid(tmp_path)
    config = tmp_path / "lta-worker.toml"
    config.write_text(render_toml(data), encoding="utf-8")

    def cli(*args: str) -> Output:
        return run_here(list(args), env={"LTA_WORKER_CONFIG": str(config)})

    assert cli("db", "upgrade").returncode == 0
    database = tmp_path / "lta.db"
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    conn.close()
    before = _fingerprint(database)
    shutil.copy2(database, tmp_path / "before.db")
    commands = [("run",), ("serve",), ("db", "upgrade"), ("status",), ("users", "list")]
    for args in commands:
        done = cli(*args)
        assert done.returncode == 78, (args, done.returncode, done.stderr[-2000:])
        assert "9999_from_the_future" in done.stderr, (args, done.stderr)
        assert "newer than this lta-worker knows" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert _fingerprint(database) == before
