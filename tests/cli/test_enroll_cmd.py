"""The enroll and users commands against the simulator on a loopback port, with a config file, a
key file and a client secret file (mode 0600), in-process (in child processes, with every secret
planted: tests/reliability/test_canary.py; a redirect used twice, a client without the mode:
tests/enrollment/test_enrollment.py); `users forget` in another process while a `run` process is
held inside a read (the simulator's latency fault, whose sleep waits for the test): the forget
wins."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from lta_worker.cli._users_cmd import _report
from lta_worker.config import LONG_TERM_SCOPES, STATS_SCOPE
from lta_worker.enrollment import DropResult
from lta_worker.errors import LtaError
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    RunningSimulator,
    Simulator,
)
from lta_worker.simulator.server import start_in_thread
from support.enroll import query_of
from support.process import REDIRECT, serve_simulator
from support.process import Workspace as Cli


def make_cli(tmp_path: Path, running: RunningSimulator) -> Cli:
    """A workspace for the demo client, logging at debug."""
    made = Cli(running, tmp_path, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)
    made.configure(log={"level": "debug"})
    return made


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with serve_simulator() as served:
        yield make_cli(tmp_path, served)


def test_url_finish_list_without_leaks(cli: Cli) -> None:
    """enroll url, consent, enroll finish, users list: alice active; no secret in any output."""
    url = cli.here("enroll", "url", "--user", "alice")
    assert url.returncode == 0, url.stderr
    assert url.stdout.count("\n") == 1
    assert url.stdout.startswith(f"{cli.running.auth_url}/oidc/auth?")
    assert url.event_names() == ["enroll.started"]

    location = cli.consent(url.stdout.strip(), "svc-alice")
    assert location.startswith(REDIRECT + "?")
    done = cli.here("enroll", "finish", "--user", "alice", stdin=location + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1
    assert "alice" in done.stdout
    assert all(scope in done.stdout for scope in LONG_TERM_SCOPES)
    assert "enroll.completed" in done.event_names()

    listed = cli.here("users", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    (alice,) = json.loads(listed.stdout)
    assert (alice["user"], alice["state"], alice["has_token"]) == ("alice", "active", True)
    assert (alice["scopes"], alice["last_polled_at"]) == (list(LONG_TERM_SCOPES), None)
    assert alice["next_due_at"].endswith("Z")
    datetime.fromisoformat(alice["next_due_at"])
    for key in ("consecutive_failures", "last_outcome", "last_code", "denied"):
        assert key in alice

    planted = [
        query_of(location)["code"],
        cli.stored_token("alice"),
        cli.client_secret,
        *cli.verifiers(),
    ]
    assert len(planted) == 4
    for value in planted:
        assert value not in cli.rendered
    assert "dspa_" not in cli.rendered


def test_enroll_token_reads_the_user_token_from_stdin(cli: Cli) -> None:
    """enroll token takes a user access token on stdin, stores the token, never prints it."""
    user_token, code = cli.user_access_token("svc-bob", f"openid {STATS_SCOPE}")
    done = cli.here("enroll", "token", "--user", "bob", stdin=user_token + "\n")
    assert done.returncode == 0, done.stderr
    assert STATS_SCOPE in done.stdout
    listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
    assert [(u["user"], u["scopes"]) for u in listed] == [("bob", [STATS_SCOPE])]
    for value in (user_token, code, cli.stored_token("bob"), DEMO_CLIENT_SECRET):
        assert value not in cli.rendered


def test_finish_takes_no_secret_from_an_argument(cli: Cli) -> None:
    """A code given as an argument is refused (exit 2); so is empty stdin."""
    assert cli.here("enroll", "finish", "--user", "alice", "the-code").returncode == 2
    empty = cli.here("enroll", "finish", "--user", "alice", stdin="")
    assert empty.returncode == 2
    assert "stdin" in empty.stderr
    assert cli.here("enroll", "token", "--user", "alice", "a-token").returncode == 2


def test_users_table_drop_and_forget(cli: Cli) -> None:
    """users list (table), drop (DELETE upstream by the client) and forget."""
    cli.enroll_by_cli("alice", "svc-alice")
    cli.enroll_by_cli("bob", "svc-bob")
    table = cli.here("users", "list")
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split()[:3] == ["USER", "STATE", "TOKEN"]
    assert [line.split()[:3] for line in lines] == [
        ["alice", "active", "yes"],
        ["bob", "active", "yes"],
    ]
    assert len({line.index("active") for line in lines}) == 1  # aligned

    cli.running.sim.clear_requests()
    dropped = cli.here("users", "drop", "--user", "alice")
    assert dropped.returncode == 0, dropped.stderr
    assert "HTTP 204" in dropped.stdout
    deletes = [r for r in cli.running.sim.requests() if r.method == "DELETE"]
    assert [(d.client, d.user, d.auth) for d in deletes] == [
        (DEMO_CLIENT_ID, "svc-alice", "long_term")
    ]

    forgot = cli.here("users", "forget", "--user", "bob")
    assert forgot.returncode == 0, forgot.stderr
    assert "purged" in forgot.stdout
    listed = {
        u["user"]: u for u in json.loads(cli.here("users", "list", "--format", "json").stdout)
    }
    assert (listed["alice"]["state"], listed["alice"]["has_token"]) == ("dropped", False)
    assert (listed["bob"]["state"], listed["bob"]["has_token"]) == ("dropped", False)

    assert "dspa_" not in cli.rendered


class ReadGate:
    """The simulator's sleep for latency faults: says when a read is held, waits for release."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    async def sleep(self, seconds: float) -> None:
        self.reached.set()
        await anyio.to_thread.run_sync(self.release.wait, 60.0)


@pytest.fixture
def gated() -> Iterator[tuple[RunningSimulator, ReadGate]]:
    gate = ReadGate()
    with start_in_thread(Simulator(sleep=gate.sleep)) as served:
        yield served, gate


def test_forget_in_another_process_wins_over_a_running_pass(
    tmp_path: Path, gated: tuple[RunningSimulator, ReadGate]
) -> None:
    """`users forget` while `run` holds the user: after the pass it is dropped, nothing stored."""
    served, gate = gated
    cli = make_cli(tmp_path, served)
    cli.enroll_by_cli("x", "svc-x")
    served.sim.inject_fault("latency", count=1, delay=1.0)
    run = cli.spawn("run")
    try:
        assert gate.reached.wait(60), "the pass never read"
        forgot = cli.cli("users", "forget", "--user", "x")
        assert forgot.returncode == 0, forgot.stderr
    finally:
        gate.release.set()
        assert run.wait(60) == 0, run.stderr()[-2000:]
    err = run.stderr()
    assert '"poll.discarded"' in err
    listed = {u["user"]: u for u in json.loads(cli.cli("users", "list", "--format", "json").stdout)}
    assert (listed["x"]["state"], listed["x"]["has_token"]) == ("dropped", False)
    exported = cli.cli("results", "export", "--user", "x")
    assert (exported.returncode, exported.stdout.strip()) == (0, "")


def test_drop_with_the_service_unreachable_is_pending_then_sent_again(cli: Cli) -> None:
    """Unreachable: `users drop` says so in one line and exits 75; a later drop confirms."""
    cli.enroll_by_cli("x", "svc-x")
    good = cli.config.read_text(encoding="utf-8")
    cli.config.write_text(
        good.replace(f'auth_url = "{cli.running.auth_url}"', 'auth_url = "http://127.0.0.1:9"'),
        encoding="utf-8",
    )
    pending = cli.here("users", "drop", "--user", "x")
    assert pending.returncode == 75, pending.stderr
    # JSON logs: every line is JSON, the last the `error` event saying the drop is retried.
    events = [json.loads(line) for line in pending.stderr.splitlines()]
    assert events[-1]["event"] == "error" and "retry" in events[-1]["message"]
    listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
    assert (listed[0]["state"], listed[0]["has_token"]) == ("dropping", True)
    cli.config.write_text(good, encoding="utf-8")
    again = cli.here("users", "drop", "--user", "x")
    assert again.returncode == 0, again.stderr
    listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
    assert (listed[0]["state"], listed[0]["has_token"]) == ("dropped", False)
    # No pass read the dropping user: the only reads are the two drops' own, one before
    # each DELETE (a plain 401 there would have kept the token).
    reads = [r for r in cli.running.sim.requests() if "/api/v1/history/" in r.path]
    assert [(r.method, r.status) for r in reads] == [("GET", 200), ("GET", 200)]


@pytest.mark.parametrize(
    ("upstream", "state", "code", "says"),
    [
        ("ok", "dropped", 0, "the service dropped the token (HTTP 204)"),
        ("skipped", "revoked", 0, "'x' is revoked: no token is held"),
        ("failed", "dropping", 75, "retry the drop"),
        ("refused", "dropping", 78, "retry the drop"),
        ("in_flight", "dropping", 75, "a DELETE of its token is already out"),
        ("ok+overtaken", "active", 75, "overtaken by a new consent"),
        ("failed+overtaken", "active", 75, "overtaken by a new consent"),
        ("ok+overtaken", "dropped", 0, "another drop of it was confirmed"),
        ("ok+overtaken", "dropping", 75, "retry the drop"),
    ],
)
def test_drop_report_exit_codes(
    capsys: pytest.CaptureFixture[str], upstream: str, state: str, code: int, says: str
) -> None:
    """A drop's report: confirmed 0 in one line; otherwise 75, or 78 when refused."""
    upstream, _, overtaken = upstream.partition("+")
    result = DropResult(
        user="x",
        upstream=upstream,  # type: ignore[arg-type]
        status=204 if upstream == "ok" else None,
        error="could not reach the service (connect)",
        previous_state="active",
        state=state,
        overtaken=bool(overtaken),
    )
    if code == 0:
        assert _report(result, "dropped") == code
        out, err = capsys.readouterr()
        lines = (out + err).splitlines()
        assert len(lines) == 1 and says in lines[0]
        return
    with pytest.raises(LtaError) as raised:  # the CLI's boundary prints its one line
        _report(result, "dropped")
    assert raised.value.exit_code == code and says in raised.value.message
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("verb", ["drop", "forget"])
def test_unusable_secret_file_changes_nothing(cli: Cli, verb: str) -> None:
    """An unusable secret file (a directory) stops drop/forget with 78 before any change or
    DELETE (each way a secret file is refused: tests/reliability/test_bad_input.py)."""
    cli.enroll_by_cli("x", "svc-x")
    cli.secret_file.unlink()
    cli.secret_file.mkdir(mode=0o700)
    done = cli.here("users", verb, "--user", "x")
    assert done.returncode == 78, done.stderr
    assert "client.secret_file" in done.stderr
    listed = json.loads(cli.here("users", "list", "--format", "json").stdout)
    assert (listed[0]["state"], listed[0]["has_token"]) == ("active", True)
    assert [r for r in cli.running.sim.requests() if r.method == "DELETE"] == []
