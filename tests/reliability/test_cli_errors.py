"""The CLI error paths not in `test_bad_input.BROKEN` (lost key, full disk, EFBIG, odd --config,
read-only directory, usage, PostgreSQL refusals, a bug, the debug switch) through a child
process (the secret file rule per command and `check` in-process): one error line, the
documented exit code, no traceback."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lta_worker.config import LATEST_CHANGE_SCOPE
from lta_worker.secret import Secret
from lta_worker.storage import Keyring, Store, Vault, load_key_file
from support.process import Output, render_toml, run_here

from .test_bad_input import _valid

PG_ENV = "LTA_TEST_DATABASE_URL"


@dataclass
class Case:
    """One error path: how to break a valid deployment, the command, what must come out."""

    name: str
    exit_code: int
    expected: str  # text the error line must contain
    args: tuple[str, ...] = ("run",)
    arrange: Callable[[Path, dict[str, Any]], None] = lambda tmp, data: None
    env: dict[str, str] = field(default_factory=dict)
    preexec: Callable[[Path], Callable[[], None] | None] = lambda tmp: None
    needs: str | None = None  # "mount" or "postgresql"
    config_arg: Callable[[Path], str] | None = None


def _mountable() -> bool:
    """True when this process may mount a tmpfs (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/lta-mount-probe-{os.getpid()}")  # removed below
    probe.mkdir(exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            return False
        subprocess.run(["umount", str(probe)], check=True)
        return True
    except FileNotFoundError:
        return False
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
    now = datetime(2025, 6, 1, tzinfo=UTC)
    token = vault.encrypt(Secret("dspa_" + "t" * 40), user="alice")
    with Store.open(data["database"]["url"]) as store:
        store.upgrade()
        store.store_token("alice", token, (LATEST_CHANGE_SCOPE,), now, next_due_at=now)


def _lost_key(tmp: Path, data: dict[str, Any]) -> None:
    """alice's token is under key id `k-lost`, which the key file does not list."""
    _enroll(data, Vault(Keyring({"k-lost": os.urandom(32)})))


def _due_user(tmp: Path, data: dict[str, Any]) -> None:
    """alice is due and her token decrypts: the pass reads (the service is down) and writes."""
    _enroll(data, Vault(load_key_file(Path(data["crypto"]["key_file"]))))


def _full_disk(tmp: Path, data: dict[str, Any]) -> None:
    """A real ENOSPC: the database on a 1 MiB tmpfs, filled to the last block."""
    disk = tmp / "disk"
    _mount(disk, "size=1m")
    data["database"]["url"] = f"sqlite:///{disk / 'lta.db'}"
    _due_user(tmp, data)
    with contextlib.suppress(OSError), (disk / "filler").open("wb") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()


def _file_size_limit(tmp: Path) -> Callable[[], None]:
    """The child may not grow any file past 1 KiB: SQLite's writes fail with EFBIG."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    return limit


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


def _pg(role: str, rest: str) -> Callable[[Path, dict[str, Any]], None]:
    """database.url on the test server, as `role` with a password, then `rest` (/db?query)."""

    def arrange(tmp: Path, data: dict[str, Any]) -> None:
        server = os.environ[PG_ENV].split("@", 1)[1].split("/", 1)[0]
        data["database"]["url"] = f"postgresql://{role}:hunter2-pw@{server}{rest}"

    return arrange


def _closed_port(tmp: Path, data: dict[str, Any]) -> None:
    data["database"]["url"] = "postgresql://postgres:hunter2-pw@127.0.0.1:1/test"


def _binary_config(tmp: Path) -> str:
    path = tmp / "binary.toml"
    path.write_bytes(bytes(range(256)) * 4)
    return str(path)


BUG = (
    "import click\n"
    "from lta_worker.cli import cli, main\n"
    "@cli.command('boom')\n"
    "def boom():\n"
    "    raise ExceptionGroup('wrapped', [KeyError('dspa_' + 'x' * 20)])\n"
    "main(['boom'])\n"
)

CASES = [
    Case("unknown key id under run", 78, "'k-lost'", arrange=_lost_key),
    Case(
        "disk full (real ENOSPC on a tmpfs)",
        75,
        "free disk space",
        arrange=_full_disk,
        needs="mount",
    ),
    Case(
        "file size limit (RLIMIT_FSIZE: EFBIG)",
        75,
        '"error": "StorageError"',
        arrange=_due_user,
        preexec=_file_size_limit,
    ),
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
    Case(
        "database file is not SQLite (run)",
        78,
        "is not a SQLite database",
        arrange=_garbage_database,
    ),
    Case(
        "database file is not SQLite (status)",
        78,
        "is not a SQLite database",
        args=("status",),
        arrange=_garbage_database,
    ),
    Case("unknown command", 2, "No such command", args=("frobnicate",)),
    Case(
        "--max-duration too large to represent",
        2,
        "too long",
        args=("run", "--max-duration", "99999999999999d"),
    ),
    Case(
        "PostgreSQL unknown database",
        78,
        "database.url",
        arrange=_pg("postgres", "/lta_no_such_database"),
        needs="postgresql",
    ),
    Case(
        "PostgreSQL unknown role",
        78,
        "database.url",
        arrange=_pg("lta_no_such_role", "/test"),
        needs="postgresql",
    ),
    Case(
        "PostgreSQL bad sslmode",
        78,
        "sslmode",
        arrange=_pg("postgres", "/test?sslmode=bogus"),
        needs="postgresql",
    ),
    Case("PostgreSQL closed port", 75, "Connection refused", arrange=_closed_port),
    Case("a bug (unexpected exception)", 1, "KeyError", args=("-c", BUG)),
]


def _run(
    tmp: Path, case: Case, extra_env: dict[str, str], child: bool = True
) -> subprocess.CompletedProcess[str] | Output:
    """`case` as a child process, or with `child=False` through `main` in-process."""
    data = _valid(tmp)
    case.arrange(tmp, data)
    config = tmp / "lta-worker.toml"
    config.write_text(render_toml(data), encoding="utf-8")
    if not child:
        return run_here(["--config", str(config), *case.args], env={**case.env, **extra_env})
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    clean.pop("CREDENTIALS_DIRECTORY", None)
    if case.args[0] == "-c":
        argv = [sys.executable, *case.args]
        clean["LTA_WORKER_CONFIG"] = str(config)
    else:
        config_arg = case.config_arg(tmp) if case.config_arg else str(config)
        argv = [sys.executable, "-m", "lta_worker", "--config", config_arg, *case.args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**clean, **case.env, **extra_env},
        timeout=60,
        check=False,
        preexec_fn=case.preexec(tmp),  # a resource limit, child only
    )


def _skip_unless_possible(case: Case) -> None:
    if case.needs == "mount" and not MOUNTABLE:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE row covers the write failure")
    if case.needs == "postgresql" and not os.environ.get(PG_ENV):
        pytest.skip(f"set {PG_ENV} to run the PostgreSQL rows")


def _error_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line parsed as JSON (a line that is not JSON fails the test)."""
    events = []
    for line in stderr.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a stderr line is not JSON: {line!r}\n{stderr[-3000:]}")
    return [e for e in events if e.get("level") == "error"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_error_path_is_one_json_line_with_its_exit_code(tmp_path: Path, case: Case) -> None:
    """JSON log mode: the documented exit code, stderr one JSON `error` event with
    `exit_code` (after a pass's own lines), no traceback, no secret."""
    _skip_unless_possible(case)
    done = _run(tmp_path, case, {"LTA_WORKER_LOG_FORMAT": "json"})
    assert done.returncode == case.exit_code, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    errors = _error_lines(done.stderr)
    assert len(errors) == 1, done.stderr[-3000:]
    (error,) = errors
    assert error["event"] == "error"
    assert error["exit_code"] == case.exit_code
    assert case.expected in json.dumps(error), error
    assert "hunter2-pw" not in done.stderr and "dspa_" not in done.stderr
    assert done.stdout == ""
    if case.name != "unknown key id under run":  # the pass logs its start and end first
        assert len(done.stderr.splitlines()) == 1, done.stderr[-3000:]


# One case per exit code for the console rendering (the JSON rows prove each line alone).
CONSOLE = [CASES[i] for i in (0, 2, 3, 10, 15)]  # 78, 75, 78, 2, 1


@pytest.mark.parametrize("case", CONSOLE, ids=[c.name for c in CONSOLE])
def test_error_path_is_one_console_line(tmp_path: Path, case: Case) -> None:
    """Console log mode: one `lta-worker: error: ...` line, the same exit code as in JSON."""
    done = _run(tmp_path, case, {"LTA_WORKER_LOG_FORMAT": "console"})
    assert done.returncode == case.exit_code, (done.returncode, done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("lta-worker: error:")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    if case.name != "unknown key id under run":  # the pass logs its start and end first
        assert done.stderr.count("\n") == 1, done.stderr[-3000:]


LOCAL_BUG = (
    "from lta_worker.cli import cli, main\n"
    "@cli.command('boom')\n"
    "def boom():\n"
    "    held_in_a_local = 'hunter2-local-value'\n"
    "    raise RuntimeError('boom ' + str(len(held_in_a_local)))\n"
    "main(ARGS)\n"
)


@pytest.mark.parametrize("switch", ["--debug", "LTA_WORKER_DEBUG=1"])
def test_debug_switch_adds_a_traceback_without_locals(tmp_path: Path, switch: str) -> None:
    """With the debug switch a bug prints its traceback (no frame locals), then the same one
    error line and exit code."""
    args = "['--debug', 'boom']" if switch == "--debug" else "['boom']"
    env = {} if switch == "--debug" else {"LTA_WORKER_DEBUG": "1"}
    case = Case("debug", 1, "", args=("-c", LOCAL_BUG.replace("ARGS", args)), env=env)
    done = _run(tmp_path, case, {"LTA_WORKER_LOG_FORMAT": "console"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr
    assert "hunter2-local-value" not in done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("lta-worker: error: unexpected RuntimeError: boom 19"), last


def test_without_debug_a_bug_names_its_type_and_the_switch(tmp_path: Path) -> None:
    """Without the debug switch a bug is one line naming the error type and how to see more."""
    case = Case("bug", 1, "", args=("-c", LOCAL_BUG.replace("ARGS", "['boom']")))
    done = _run(tmp_path, case, {"LTA_WORKER_LOG_FORMAT": "console"})
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "RuntimeError" in done.stderr and "--debug" in done.stderr


def test_existing_database_open_to_others_is_refused(tmp_path: Path) -> None:
    """A SQLite database file that others can read (0644) stops `run` with 78 naming
    database.url and the chmod to apply; group access (0640) is accepted."""
    database = tmp_path / "lta.db"
    sqlite3.connect(database).close()
    database.chmod(0o644)
    case = Case("db 0644", 78, "")
    done = _run(tmp_path, case, {"LTA_WORKER_LOG_FORMAT": "console"}, child=False)
    assert done.returncode == 78, done.stderr
    assert "database.url" in done.stderr and f"chmod o-rwx {database}" in done.stderr
    database.chmod(0o640)
    assert _run(tmp_path, case, {}, child=False).returncode == 0


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


# `run` with the key file or the database at 0644: test_bad_input.BROKEN and the test above.
SECRET_FILE_USES = [
    ("client.secret_file", ("run",)),
    ("crypto.key_file", ("keys", "rotate")),
    ("crypto.key_file", ("enroll", "url", "--user", "alice")),
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
    exit 78, one line naming the setting and the chmod that fixes it."""
    case = Case(setting, 78, setting, args=args, arrange=_open_to_others(setting))
    done = _run(tmp_path, case, {"LTA_WORKER_LOG_FORMAT": "console"}, child=False)
    assert done.returncode == 78, (done.returncode, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert setting in done.stderr and "chmod" in done.stderr, done.stderr


def test_check_names_a_database_file_that_is_not_sqlite(tmp_path: Path) -> None:
    """`check` on a database file of random bytes: exit 78, its database check names
    database.url and says to restore the file, not a temporary failure."""
    case = Case("check", 78, "", args=("check", "--format", "json"), arrange=_garbage_database)
    done = _run(tmp_path, case, {}, child=False)
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

    run = _run(tmp_path, Case("run", 78, "", arrange=on_read_only_disk), {})
    assert run.returncode == 78, run.stderr[-2000:]
    (run_error,) = _error_lines(run.stderr)
    check = Case("check", 78, "", args=("check", "--format", "json"), arrange=on_read_only_disk)
    done = _run(tmp_path, check, {})
    assert done.returncode == 78, (done.stdout, done.stderr[-2000:])
    database = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["database"]
    assert not database["ok"] and database["exit_code"] == 78, database
    assert database["message"].startswith("database.url: ")
    assert database["hint"] == run_error["hint"]
