"""The enroll and users commands against the simulator on a loopback port, with a config file, a
key file and a client secret file (mode 0600), in-process (in child processes, with every secret
planted: tests/reliability/test_canary.py; a redirect used twice, a client without the mode:
tests/enrollment/test_enrollment.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from lta_worker.config import LONG_TERM_SCOPES, STATS_SCOPE
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    RunningSimulator,
)
from support.enroll import query_of
from support.process import REDIRECT, serve_simulator
from support.process import Workspace as Cli


def make_cli(tmp_path: Path, running: RunningSimulator, client_id: str, secret: str) -> Cli:
    """A workspace for `client_id`, logging at debug."""
    made = Cli(running, tmp_path, client_id, secret)
    made.configure(log={"level": "debug"})
    return made


@pytest.fixture
def running() -> Iterator[RunningSimulator]:
    with serve_simulator() as served:
        yield served


@pytest.fixture
def cli(tmp_path: Path, running: RunningSimulator) -> Cli:
    return make_cli(tmp_path, running, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)


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
    assert alice["user"] == "alice"
    assert alice["state"] == "active"
    assert alice["has_token"] is True
    assert alice["scopes"] == list(LONG_TERM_SCOPES)
    assert alice["last_polled_at"] is None
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
