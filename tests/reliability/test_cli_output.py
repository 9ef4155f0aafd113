"""The CLI's standard output when it is not an ordinary file or terminal: a reader that went
away (`| head -1`), a closed descriptor (`>&-`) and an encoding that cannot show the text.
Each through the real entry point in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.process import render_toml

from .test_bad_input import _valid

EX_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell shows for `yes | head -1`


def _lta(
    *args: str,
    stdout: int | None = subprocess.PIPE,
    env: dict[str, str] | None = None,
    **kw: object,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "lta_worker", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUTF8": "1", **(env or {})},
        timeout=60,
        check=False,
        **kw,
    )


def _config(tmp: Path) -> str:
    path = tmp / "lta-worker.toml"
    path.write_text(render_toml(_valid(tmp)), encoding="utf-8")
    assert _lta("--config", str(path), "db", "upgrade").returncode == 0
    return str(path)


def test_a_reader_gone_before_the_output_ends_it_quietly_with_141(tmp_path: Path) -> None:
    """Output into a pipe nobody reads: exit 141 as `yes | head` does, and nothing on stderr."""
    config = _config(tmp_path)
    for args in (("keys", "generate"), ("--config", config, "users", "list", "--format", "json")):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first write
        try:
            done = _lta(*args, stdout=write_end)
        finally:
            os.close(write_end)
        assert (done.returncode, done.stderr) == (EX_BROKEN_PIPE, b""), (args, done)


def test_a_closed_standard_output_is_a_usage_error_not_silence(tmp_path: Path) -> None:
    """With descriptor 1 closed, a command whose output is the point fails with exit 2 and
    says why, instead of exiting 0 having printed nothing (or crashing)."""
    config = _config(tmp_path)
    for args in (("keys", "generate"), ("--config", config, "status", "--format", "json")):
        done = _lta(*args, stdout=None, preexec_fn=lambda: os.close(1))
        assert done.returncode == 2, (args, done)
        line = json.loads(done.stderr.decode().splitlines()[-1]) if "--config" in args else None
        text = done.stderr.decode()
        assert "standard output is closed" in text, text
        assert "Traceback" not in text
        if line is not None:
            assert (line["event"], line["exit_code"]) == ("error", 2)


ASCII_ONLY = {"PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii", "LC_ALL": "C"}


def test_a_non_ascii_user_id_under_an_ascii_locale_is_the_same_id(tmp_path: Path) -> None:
    """Under LC_ALL=C without UTF-8 mode a UTF-8 user id is read as the same id (here: not
    enrolled, exit 2 naming it), not as surrogates that fail the command with exit 1."""
    config = _config(tmp_path)
    user = "\u00fcn\u00ef-\u7528\u6237"
    done = _lta("--config", config, "results", "export", "--user", user, env=ASCII_ONLY)
    assert done.returncode == 2, done
    line = json.loads(done.stderr.decode().splitlines()[-1])
    assert (line["error"], line["message"]) == (
        "UnknownUserError",
        f"no user {user!r} in the database",
    )


def test_an_argument_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in an argument: exit 2 saying which argument, no traceback."""
    config = _config(tmp_path)
    command = [sys.executable.encode(), b"-m", b"lta_worker", b"--config", config.encode()]
    done = subprocess.run(
        [*command, b"results", b"export", b"--user", b"\xff"],
        capture_output=True,
        env={**os.environ, **ASCII_ONLY},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert "argument 6 is not UTF-8 text" in done.stderr.decode()
