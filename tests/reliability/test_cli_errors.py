"""The CLI error paths not in `test_bad_input.BROKEN` (lost key, full disk, EFBIG, odd --config,
read-only directory, usage, a bug, the debug switch, the secret file rule per command), through
`main` in-process (EFBIG in a child, for its resource limit): one error line, the documented exit
code, no traceback. PostgreSQL's refusals: tests/storage/test_dberrors.py; the interpreter's own
exit code per code: tests/service/test_exit_codes.py."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lta_worker.cli import cli
from lta_worker.config import LATEST_CHANGE_SCOPE
from lta_worker.storage import Keyring, Store, Vault, load_key_file
from support.process import Output, child_env, render_toml, run_here
from support.storage import enroll

from .test_bad_input import _valid


@dataclass
class Case:
    """One error path: how to break a valid deployment, the command, what must come out."""

    name: str
    exit_code: int
    expected: str  # text the error line must contain
    args: tuple[str, ...] = ("run",)
    arrange: Callable[[Path, dict[str, Any]], None] = lambda tmp, data: None
    config_arg: Callable[[Path], str] | None = None


def _mountable() -> bool:
    """True when this process may mount a tmpfs (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(tempfile.mkdtemp(prefix="lta-mount-probe-"))
    try:
        mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)]
        if subprocess.run(mount, capture_output=True, check=False).returncode != 0:
            return False
        return subprocess.run(["umount", str(probe)], check=False).returncode == 0
    finally:
        probe.rmdir()


MOUNTABLE = _mountable()
_MOUNTS: list[Path] = []


def _mount(path: Path, options: str) -> None:
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    _MOUNTS.append(path)


@pytest.fixture(autouse=True)
def _unmount() -> Iterator[None]:
    yield
    while _MOUNTS:
        subprocess.run(["umount", "-l", str(_MOUNTS.pop())], check=False)


def _enroll(data: dict[str, Any], vault: Vault) -> None:
    """Store one due user, alice, with her token encrypted by `vault`."""
    with Store.open(data["database"]["url"]) as store:
        store.upgrade()
        enroll(store, vault, "alice", scopes=(LATEST_CHANGE_SCOPE,))


def _lost_key(tmp: Path, data: dict[str, Any]) -> None:
    """alice's token is under key id `k-lost`, which the key file does not list."""
    _enroll(data, Vault(Keyring({"k-lost": os.urandom(32)})))


def _due_user(tmp: Path, data: dict[str, Any]) -> None:
    """alice is due and her token decrypts: the pass reads (the service is down) and writes."""
    _enroll(data, Vault(load_key_file(Path(data["crypto"]["key_file"]))))


def _full_disk(tmp: Path, data: dict[str, Any]) -> None:
    """A real ENOSPC: the database on a 1 MiB tmpfs, filled to the last block."""
    if not MOUNTABLE:
        pytest.skip("mounting a tmpfs needs root; the EFBIG test covers the write failure")
    disk = tmp / "disk"
    _mount(disk, "size=1m")
    data["database"]["url"] = f"sqlite:///{disk / 'lta.db'}"
    _due_user(tmp, data)
    with contextlib.suppress(OSError), (disk / "filler").open("wb") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()


def _read_only_dir(tmp: Path, data: dict[str, Any]) -> None:
    """A database URL in a directory the worker cannot write."""
    where = tmp / "ro"
    if MOUNTABLE:
        _mount(where, "ro,size=64k")
    else:
        where.mkdir()
        where.chmod(0o555)
    data["database"]["url"] = f"sqlite:///{where / 'lta.db'}"


def _garbage_database(tmp: Path, data: dict[str, Any]) -> None:
    """database.url names a 0600 file of random bytes, not a SQLite database."""
    database = tmp / "lta.db"
    database.write_bytes(os.urandom(65536))
    database.chmod(0o600)


def _binary_config(tmp: Path) -> str:
    path = tmp / "binary.toml"
    path.write_bytes(bytes(range(256)) * 4)
    return str(path)


@pytest.fixture
def boom() -> Iterator[None]:
    """A `boom` command that fails as a bug would, its message holding a token."""

    @cli.command("boom")
    def _boom() -> None:
        held_in_a_local = "hunter2-local-value"
        raise ExceptionGroup("wrapped", [KeyError("dspa_" + "x" * len(held_in_a_local))])

    yield
    cli.commands.pop("boom")


CASES = [
    Case("unknown key id under run", 78, "'k-lost'", arrange=_lost_key),
    Case("disk full (real ENOSPC on a tmpfs)", 75, "free disk space", arrange=_full_disk),
    Case("--config is a directory", 78, "not a regular file", config_arg=str),
    Case("--config is a binary file", 78, "not UTF-8", config_arg=_binary_config),
    Case(
        "--config is a FIFO",
        78,
        "not a regular file",
        config_arg=lambda tmp: (os.mkfifo(tmp / "fifo.toml"), str(tmp / "fifo.toml"))[1],
    ),
    Case(
        "new SQLite database in a read-only directory", 78, "database.url", arrange=_read_only_dir
    ),
    Case("database file is not SQLite", 78, "is not a SQLite database", arrange=_garbage_database),
    Case("unknown command", 2, "No such command", args=("frobnicate",)),
    Case(
        "--max-duration too large to represent",
        2,
        "too long",
        args=("run", "--max-duration", "99999999999999d"),
    ),
    Case("a bug (unexpected exception)", 1, "KeyError", args=("boom",)),
]


def _run(tmp: Path, case: Case, fmt: str | None = None) -> Output:
    """`case` through `main` in this process (with `fmt`, under LTA_WORKER_LOG_FORMAT)."""
    data = _valid(tmp)
    case.arrange(tmp, data)
    config = tmp / "lta-worker.toml"
    config.write_text(render_toml(data), encoding="utf-8")
    config_arg = case.config_arg(tmp) if case.config_arg else str(config)
    env = {"LTA_WORKER_LOG_FORMAT": fmt} if fmt else {}
    return run_here(["--config", config_arg, *case.args], env=env)


def _error_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line parsed as JSON (a line that is not JSON fails the test)."""
    events = []
    for line in stderr.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a stderr line is not JSON: {line!r}\n{stderr[-3000:]}")
    return [e for e in events if e.get("level") == "error"]


def _assert_one_error(done: Output, case: Case, fmt: str) -> None:
    """The documented exit code, one error line (after a pass's own lines), no traceback."""
    assert done.returncode == case.exit_code, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    assert "dspa_" not in done.stderr and done.stdout == ""
    if case.name != "unknown key id under run":  # the pass logs its start and end first
        assert done.stderr.count("\n") == 1, done.stderr[-3000:]
    if fmt == "console":
        lines = [line for line in done.stderr.splitlines() if line.startswith("lta-worker: error:")]
        assert len(lines) == 1, done.stderr[-3000:]
        return
    (error,) = _error_lines(done.stderr)
    assert (error["event"], error["exit_code"]) == ("error", case.exit_code)
    assert case.expected in json.dumps(error), error


@pytest.mark.usefixtures("boom")
@pytest.mark.parametrize("fmt", ["json", "console"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_error_path_is_one_line_with_its_exit_code(tmp_path: Path, case: Case, fmt: str) -> None:
    """JSON or console log mode: the documented exit code, one error line, no traceback."""
    _assert_one_error(_run(tmp_path, case, fmt), case, fmt)


def test_file_size_limit_is_temporary(tmp_path: Path) -> None:
    """A child that may not grow any file past 1 KiB (RLIMIT_FSIZE: EFBIG) exits 75, one line."""
    data = _valid(tmp_path)
    _due_user(tmp_path, data)
    config = tmp_path / "lta-worker.toml"
    config.write_text(render_toml(data), encoding="utf-8")

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    child = subprocess.run(
        [sys.executable, "-m", "lta_worker", "--config", str(config), "run"],
        capture_output=True,
        text=True,
        env=child_env(LTA_WORKER_LOG_FORMAT="json"),
        timeout=60,
        check=False,
        preexec_fn=limit,
    )
    done = Output("run", child.returncode, child.stdout, child.stderr)
    _assert_one_error(done, Case("EFBIG", 75, '"error": "StorageError"'), "json")


@pytest.mark.usefixtures("boom")
@pytest.mark.parametrize("switch", ["--debug", "LTA_WORKER_DEBUG=1", None])
def test_debug_switch_adds_a_traceback_without_locals(tmp_path: Path, switch: str | None) -> None:
    """With the debug switch a bug prints its traceback (no frame locals), then the same one
    error line; without it, that line alone names the error type and the switch."""
    args = ("--debug", "boom") if switch == "--debug" else ("boom",)
    env = {"LTA_WORKER_DEBUG": "1"} if switch == "LTA_WORKER_DEBUG=1" else {}
    done = run_here(list(args), env={"LTA_WORKER_LOG_FORMAT": "console", **env})
    assert done.returncode == 1, done.stderr
    assert "hunter2-local-value" not in done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("lta-worker: error: unexpected KeyError"), last
    if switch is None:
        assert done.stderr.count("\n") == 1 and "--debug" in done.stderr
    else:
        assert "Traceback" in done.stderr


def _open_to_others(setting: str) -> Callable[[Path, dict[str, Any]], None]:
    """Make the file behind `setting` readable by group and others (0644)."""

    def arrange(tmp: Path, data: dict[str, Any]) -> None:
        if setting == "database.url":
            database = tmp / "lta.db"
            sqlite3.connect(database).close()
            database.chmod(0o644)
        else:
            section, _, key = setting.partition(".")
            Path(data[section][key]).chmod(0o644)

    return arrange


# `run` with the key file at 0644: test_bad_input.BROKEN.
SECRET_FILE_USES = [
    ("client.secret_file", ("run",)),
    ("crypto.key_file", ("keys", "rotate")),
    ("crypto.key_file", ("enroll", "url", "--user", "alice")),
    ("database.url", ("run",)),
    ("database.url", ("db", "upgrade")),
    ("database.url", ("status",)),
    ("database.url", ("users", "list")),
    ("database.url", ("results", "export")),
    ("database.url", ("keys", "rotate")),
]


@pytest.mark.parametrize(
    ("setting", "args"), SECRET_FILE_USES, ids=[f"{s} {' '.join(a)}" for s, a in SECRET_FILE_USES]
)
def test_every_command_applies_the_secret_file_rule(
    tmp_path: Path, setting: str, args: tuple[str, ...]
) -> None:
    """Each command that uses a secret file (or the database file) refuses it at 0644 with
    exit 78, one line naming the setting and the chmod that fixes it; 0640 is accepted."""
    case = Case(setting, 78, setting, args=args, arrange=_open_to_others(setting))
    done = _run(tmp_path, case, "console")
    assert done.returncode == 78, (done.returncode, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert setting in done.stderr and "chmod" in done.stderr, done.stderr
    if setting == "database.url" and args == ("run",):
        assert f"chmod o-rwx {tmp_path / 'lta.db'}" in done.stderr
        (tmp_path / "lta.db").chmod(0o640)
        assert _run(tmp_path, Case("0640", 0, "")).returncode == 0


def test_check_names_a_database_file_that_is_not_sqlite(tmp_path: Path) -> None:
    """`check` on a database file of random bytes: exit 78, its database check names
    database.url and says to restore the file, not a temporary failure."""
    case = Case("check", 78, "", args=("check", "--format", "json"), arrange=_garbage_database)
    done = _run(tmp_path, case)
    assert done.returncode == 78, (done.returncode, done.stdout, done.stderr[-2000:])
    failed = {c["name"]: c for c in json.loads(done.stdout)["checks"] if not c["ok"]}
    assert failed["database"]["exit_code"] == 78
    assert "database.url" in failed["database"]["message"]
    assert "is not a SQLite database" in failed["database"]["message"]
    assert "backup" in failed["database"]["hint"]


def test_check_fails_on_a_database_run_cannot_write(tmp_path: Path) -> None:
    """A migrated SQLite database on a read-only filesystem: `run` exits 78, and `check`
    fails its database check with 78 naming database.url and run's hint, not `ok`."""
    if not MOUNTABLE:
        pytest.skip("a read-only tmpfs needs root; tests/worker/test_check_database.py covers it")
    where = tmp_path / "ro"
    _mount(where, "size=1m")
    url = f"sqlite:///{where / 'lta.db'}"

    def on_read_only_disk(tmp: Path, data: dict[str, Any]) -> None:
        data["database"]["url"] = url
        if not (where / "lta.db").exists():
            _due_user(tmp, data)
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)

    run = _run(tmp_path, Case("run", 78, "", arrange=on_read_only_disk))
    assert run.returncode == 78, run.stderr[-2000:]
    (run_error,) = _error_lines(run.stderr)
    check = Case("check", 78, "", args=("check", "--format", "json"), arrange=on_read_only_disk)
    done = _run(tmp_path, check)
    assert done.returncode == 78, (done.stdout, done.stderr[-2000:])
    database = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["database"]
    assert not database["ok"] and database["exit_code"] == 78, database
    assert database["message"].startswith("database.url: ")
    assert database["hint"] == run_error["hint"]
