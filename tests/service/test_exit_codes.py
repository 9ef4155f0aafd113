"""Every cell of docs/operations.md's table of exit codes per command, through the CLI against
the served simulator: the table and the program agree. `main()` in-process, except one child
process per exit code (`IN_A_CHILD`), whose interpreter must exit with it."""

from __future__ import annotations

import functools
import json
import signal
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from lta_worker.domain import PassRecord
from support.process import REDIRECT, Workspace, free_port, stop

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
CODES = ("0", "1", "2", "75", "78")


def documented_cells() -> list[tuple[str, int]]:
    """(command, code) for every cell of the per-command table that is not `-`."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("Every command's codes") :]
    cells: list[tuple[str, int]] = []
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for line in rows[: rows.index(next(r for r in rows if r.startswith("| `check`"))) + 1]:
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        command = parts[0].strip("`")
        for code, cell in zip(CODES, parts[1:], strict=True):
            if cell != "-":
                cells.append((command, int(code)))
    return cells


def cli(world: Workspace, *args: str, stdin: str = "") -> int:
    """`lta-worker --config CFG ARGS` with `stdin`; its exit code."""
    return world.here(*args, stdin=stdin).returncode or 0


def bad_config(world: Workspace) -> None:
    world.configure(poll={"interval": "0s"})


def service_down(world: Workspace) -> None:
    """Both service URLs at a port nobody listens on."""
    port = free_port()
    text = world.config_text()
    for url in {world.running.base_url, world.running.auth_url}:
        text = text.replace(url, f"http://127.0.0.1:{port}")
    world.write_config(text)


def database_down(world: Workspace) -> None:
    """A PostgreSQL URL at a port nobody listens on (connection refused: temporary)."""
    url = f"postgresql://lta@127.0.0.1:{free_port()}/lta"
    world.write_config(world.config_text().replace(f"sqlite:///{world.database}", url))


def enrolled(world: Workspace) -> None:
    world.enroll(["ada"])


def consent_url(world: Workspace) -> str:
    done = world.here("enroll", "url", "--user", "ada")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def serve_until_first_pass(world: Workspace) -> int:
    """Without $NOTIFY_SOCKET (not under systemd): a pass, then SIGINT (SIGTERM: test_serve)."""
    proc = world.start_serve()
    try:
        assert world.wait_for_event("pass.finished", proc)["ok"] == 2
        proc.send_signal(signal.SIGINT)
        code = proc.wait(20)
    finally:
        stop(proc)
    assert world.log_events()[-1]["event"] == "service.stopped"
    return code


def serve_locked(world: Workspace) -> int:
    with world.store() as store, store.single_instance_lock():
        return world.serve_until_exit()


def enroll_finish_ok(world: Workspace) -> int:
    url = consent_url(world)
    world.sim.add_user("ada")
    world.sim.queue_consent("ada", None)
    location = httpx.get(url).headers["location"]
    return cli(world, "enroll", "finish", "--user", "ada", stdin=location + "\n")


def enroll_finish_unreachable(world: Workspace) -> int:
    state = parse_qs(urlsplit(consent_url(world)).query)["state"][0]
    service_down(world)
    redirect = f"{REDIRECT}?code=abc&state={state}\n"
    return cli(world, "enroll", "finish", "--user", "ada", stdin=redirect)


def newer_schema(world: Workspace) -> int:
    enrolled(world)
    with sqlite3.connect(world.database) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    return cli(world, "db", "upgrade")


def unhealthy(world: Workspace) -> int:
    enrolled(world)
    now = datetime.now(UTC)
    with world.store() as store:
        store.record_pass(PassRecord("x", now, now, "breaker", 78, 0, 0, {}))
    return cli(world, "status", "--check")


def keys_open(world: Workspace) -> int:
    enrolled(world)
    world.key_file.chmod(0o644)
    return cli(world, "keys", "rotate")


def run_unreachable(world: Workspace) -> int:
    """The error event is the last line, after `pass.finished`."""
    enrolled(world)
    service_down(world)
    done = world.here("run")
    event = json.loads(done.stderr.splitlines()[-1])
    assert (event["event"], event["level"], event["exit_code"]) == ("error", "error", 75)
    assert event["message"] and event["error"] == "PassStoppedError"
    return done.returncode or 0


def check_unreachable(world: Workspace) -> int:
    """The `service` check is the one that failed, with 75."""
    enrolled(world)
    service_down(world)
    done = world.here("check", "--format", "json")
    service = json.loads(done.stdout)["checks"][-1]
    assert (service["name"], service["ok"], service["exit_code"]) == ("service", False, 75)
    return done.returncode or 0


Setup = Callable[[Workspace], None]


def then(setup: Setup | tuple[Setup, ...], *args: str) -> Callable[[Workspace], int]:
    """Prepare the world with `setup` (or each of several), then run `lta-worker ARGS`."""

    def scenario(world: Workspace) -> int:
        for step in setup if isinstance(setup, tuple) else (setup,):
            step(world)
        return cli(world, *args)

    return scenario


def nothing(_world: Workspace) -> None:
    """A world whose database was never set up."""


SCENARIOS: dict[tuple[str, int], Callable[[Workspace], int]] = {
    ("run", 0): then(enrolled, "run"),
    ("run", 2): then(enrolled, "run", "--max-duration", "soon"),
    ("run", 75): run_unreachable,
    ("run", 78): then(bad_config, "run"),
    ("serve", 0): lambda w: (enrolled(w), serve_until_first_pass(w))[1],
    ("serve", 2): then(nothing, "serve", "--forever"),
    ("serve", 75): lambda w: (enrolled(w), serve_locked(w))[1],
    ("serve", 78): then(bad_config, "serve"),
    ("enroll url", 0): then(nothing, "enroll", "url", "--user", "ada"),
    ("enroll url", 2): then(nothing, "enroll", "url"),
    ("enroll url", 75): then(database_down, "enroll", "url", "--user", "ada"),
    ("enroll url", 78): then(bad_config, "enroll", "url", "--user", "ada"),
    ("enroll finish", 0): enroll_finish_ok,
    ("enroll finish", 2): then(enrolled, "enroll", "finish", "--user", "ada"),
    ("enroll finish", 75): enroll_finish_unreachable,
    ("enroll finish", 78): then(bad_config, "enroll", "finish", "--user", "ada"),
    ("users list", 0): then(enrolled, "users", "list"),
    ("users list", 2): then(enrolled, "users", "list", "--format", "xml"),
    ("users list", 75): then(database_down, "users", "list"),
    ("users list", 78): then(nothing, "users", "list"),
    ("users drop", 0): then(enrolled, "users", "drop", "--user", "ada"),
    ("users drop", 2): then(enrolled, "users", "drop", "--user", "zed"),
    ("users drop", 75): then((enrolled, service_down), "users", "drop", "--user", "ada"),
    ("users drop", 78): then((enrolled, bad_config), "users", "drop", "--user", "ada"),
    ("results export", 0): then(enrolled, "results", "export"),
    ("results export", 2): then(enrolled, "results", "export", "--user", "zed"),
    ("results export", 75): then(database_down, "results", "export"),
    ("results export", 78): then(nothing, "results", "export"),
    ("keys generate", 0): then(nothing, "keys", "generate"),
    ("keys generate", 2): then(nothing, "keys", "generate", "--nope"),
    ("keys rotate", 0): then(enrolled, "keys", "rotate"),
    ("keys rotate", 2): then(nothing, "keys", "rotate", "--nope"),
    ("keys rotate", 75): then(database_down, "keys", "rotate"),
    ("keys rotate", 78): keys_open,
    ("db upgrade", 0): then(nothing, "db", "upgrade"),
    ("db upgrade", 2): then(nothing, "db", "upgrade", "--nope"),
    ("db upgrade", 75): then(database_down, "db", "upgrade"),
    ("db upgrade", 78): newer_schema,
    ("status", 0): then(enrolled, "status", "--check"),
    ("status", 1): unhealthy,
    ("status", 2): then(enrolled, "status", "--format", "xml"),
    ("status", 75): then(database_down, "status"),
    ("status", 78): then(nothing, "status"),
    ("check", 0): then(enrolled, "check"),
    ("check", 2): then(enrolled, "check", "--format", "xml"),
    ("check", 75): check_unreachable,
    ("check", 78): then(nothing, "check"),
}


def test_every_documented_cell_has_a_scenario() -> None:
    """The table and this test list the same (command, code) cells."""
    assert sorted(documented_cells()) == sorted(SCENARIOS)


# `serve 0` and `serve 75` spawn `serve` themselves.
IN_A_CHILD = {("status", 1), ("users list", 2), ("run", 75), ("run", 78)}


@pytest.mark.parametrize(("command", "code"), sorted(SCENARIOS), ids=str)
def test_exit_code(
    world: Workspace, monkeypatch: pytest.MonkeyPatch, command: str, code: int
) -> None:
    """The command exits with the documented code in the situation the table names."""
    if (command, code) in IN_A_CHILD:
        monkeypatch.setattr(world, "here", functools.partial(world.cli, timeout=60))
    assert SCENARIOS[(command, code)](world) == code
