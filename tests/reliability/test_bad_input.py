"""Bad input: pathological bodies classify quickly (hostile headers and bodies fuzzed:
tests/pacing/test_window.py, tests/domain/test_classify.py, tests/engine/test_read_path_fuzz.py);
broken configurations through `lta-worker run` (in-process `main`) exit 78 in one line naming the
key; a database from a newer schema is refused by every command and left unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lta_worker.domain import Answer, classify
from lta_worker.storage import generate_key_line
from support.process import Output, render_toml, run_here, write_private

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
KEY = generate_key_line(NOW) + "\n"

# -- pathological bodies -------------------------------------------------------------------

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
    secret = write_private(tmp / "secret", "a-client-secret\n")
    keys = write_private(tmp / "keys", KEY)
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


def _file(name: str, content: str | bytes, mode: int = 0o600) -> Callable[[Sections, Path], None]:
    """Write `content` into the valid configuration's file `name` (keys, secret)."""

    def change(data: Sections, tmp: Path) -> None:
        path = tmp / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(mode)

    return change


def _fifo(section: str, key: str) -> Callable[[Sections, Path], None]:
    """The setting names a FIFO (mode 0600) that no one ever writes: reading would block."""

    def change(data: Sections, tmp: Path) -> None:
        fifo = tmp / f"fifo-{key}"
        os.mkfifo(fifo, 0o600)
        data[section][key] = str(fifo)

    return change


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
    ("secret file empty", _file("secret", "\n"), {}, "client.secret_file"),
    ("no secret file configured", _drop("client", "secret_file"), {}, "client.secret_file"),
    ("key file missing", _set("crypto", "key_file", "/nonexistent/keys"), {}, "crypto.key_file"),
    ("key file mode 0644", _file("keys", KEY, 0o644), {}, "crypto.key_file"),
    ("key file mode 0640", _file("keys", KEY, 0o640), {}, "chmod 600"),
    ("key file a FIFO", _fifo("crypto", "key_file"), {}, "crypto.key_file"),
    ("key file with a BOM", _file("keys", "\ufeff" + KEY), {}, "BOM"),
    ("secret file with a BOM", _file("secret", b"\xef\xbb\xbfa-client-secret\n"), {}, "BOM"),
    ("secret file non-ASCII", _file("secret", "a-cl\u00efent\n"), {}, "client.secret_file"),
    ("secret file not UTF-8", _file("secret", b"a-\xff-secret\n"), {}, "client.secret_file"),
    ("secret file on two lines", _file("secret", "a-secret\nline 2\n"), {}, "client.secret_file"),
    ("secret file mode 0644", _file("secret", "a-client-secret\n", 0o644), {}, "chmod 600"),
    ("secret file a FIFO", _fifo("client", "secret_file"), {}, "client.secret_file"),
    ("secret file a directory", _set("client", "secret_file", "/"), {}, "client.secret_file"),
    ("key file with no key", _file("keys", "# nothing\n"), {}, "crypto.key_file"),
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
    commands = [("run",), ("serve",), ("db", "upgrade"), ("status",), ("users", "list")]
    for args in commands:
        done = cli(*args)
        assert done.returncode == 78, (args, done.returncode, done.stderr[-2000:])
        assert "9999_from_the_future" in done.stderr, (args, done.stderr)
        assert "newer than this lta-worker knows" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert _fingerprint(database) == before
