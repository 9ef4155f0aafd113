"""The enroll, users and results commands, run as a real process against the simulator on a
loopback port, with a config file, a key file and a client secret file (mode 0600)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from lta_worker.config import LONG_TERM_SCOPES, STATS_SCOPE
from lta_worker.domain import EncryptedToken, SnapshotWrite, UserUpdate
from lta_worker.enrollment import challenge_s256
from lta_worker.secret import Secret
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    PLAIN_CLIENT_ID,
    PLAIN_CLIENT_SECRET,
    RunningSimulator,
    Simulator,
    start_in_thread,
)
from lta_worker.storage import PendingEnrollmentRow, Store, Vault, generate_key_line, load_key_file
from support.enroll import basic, query_of, write_private

REDIRECT = "http://127.0.0.1/lta/callback"


@dataclass
class Cli:
    """Runs `lta-worker` in a child process and keeps every byte it printed."""

    running: RunningSimulator
    config: Path
    database: Path
    key_file: Path
    client_secret: str
    outputs: list[str] = field(default_factory=list)

    def __call__(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LTA_WORKER_") and k != "CREDENTIALS_DIRECTORY"
        }
        env["LTA_WORKER_CONFIG"] = str(self.config)
        done = subprocess.run(
            [sys.executable, "-m", "lta_worker", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        self.outputs += [done.stdout, done.stderr]
        return done

    @property
    def rendered(self) -> str:
        """Everything every command printed, stdout and stderr."""
        return "\n".join(self.outputs)

    def store(self) -> Store:
        return Store.open(f"sqlite:///{self.database}")

    def vault(self) -> Vault:
        return Vault(load_key_file(self.key_file))

    def stored_token(self, user: str) -> str:
        with self.store() as store:
            row = store.get_user(user)
        assert row is not None
        assert row.token is not None
        return self.vault().decrypt(row.token, user=user).reveal()

    def verifiers(self) -> list[str]:
        """Every PKCE verifier the commands created, decrypted from the database."""
        table = PendingEnrollmentRow.__table__
        with self.store() as store, store.database.read() as conn:
            rows = conn.execute(
                select(table.c.user, table.c.verifier_ciphertext, table.c.verifier_key_id)
            ).all()
        vault = self.vault()
        return [
            vault.decrypt(
                EncryptedToken(bytes(r.verifier_ciphertext), r.verifier_key_id),
                user=r.user,
                purpose="verifier",
            ).reveal()
            for r in rows
        ]

    def consent(self, url: str, sim_user: str, scopes: list[str] | None = None) -> str:
        """Queue a consent over the control API, visit the URL, return the Location."""
        body: dict[str, object] = {"user": sim_user}
        if scopes is not None:
            body["scopes"] = scopes
        queued = httpx.post(f"{self.running.control_url}/consent", json=body)
        assert queued.status_code == 202, queued.text
        response = httpx.get(url, follow_redirects=False)
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def enroll(self, user: str, sim_user: str) -> str:
        """Enroll through `enroll url` and `enroll finish`; return the redirect used."""
        url = self("enroll", "url", "--user", user)
        assert url.returncode == 0, url.stderr
        location = self.consent(url.stdout.strip(), sim_user)
        done = self("enroll", "finish", "--user", user, stdin=location + "\n")
        assert done.returncode == 0, done.stderr
        return location


def make_cli(tmp_path: Path, running: RunningSimulator, client_id: str, secret: str) -> Cli:
    secret_file = write_private(tmp_path / "client-secret", secret + "\n")
    key_file = write_private(tmp_path / "token-keys", generate_key_line(datetime.now(UTC)) + "\n")
    database = tmp_path / "lta.db"
    config = tmp_path / "lta-worker.toml"
    config.write_text(
        f"""
[service]
base_url = "{running.base_url}"
auth_url = "{running.auth_url}"

[client]
id = "{client_id}"
secret_file = "{secret_file}"
redirect_uri = "{REDIRECT}"

[database]
url = "sqlite:///{database}"

[crypto]
key_file = "{key_file}"

[log]
level = "debug"
format = "json"
""",
        encoding="utf-8",
    )
    return Cli(running, config, database, key_file, secret)


@pytest.fixture
def running() -> Iterator[RunningSimulator]:
    with start_in_thread(Simulator()) as served:
        yield served


@pytest.fixture
def cli(tmp_path: Path, running: RunningSimulator) -> Cli:
    return make_cli(tmp_path, running, DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)


def log_events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_url_finish_list_without_leaks(cli: Cli) -> None:
    """enroll url -> consent -> enroll finish (stdin) -> users list shows alice active, both
    scopes; no token, code, verifier or client secret in any output."""
    url = cli("enroll", "url", "--user", "alice")
    assert url.returncode == 0, url.stderr
    assert url.stdout.count("\n") == 1
    assert url.stdout.startswith(f"{cli.running.auth_url}/oidc/auth?")
    assert [e["event"] for e in log_events(url.stderr)] == ["enroll.started"]

    location = cli.consent(url.stdout.strip(), "svc-alice")
    assert location.startswith(REDIRECT + "?")
    done = cli("enroll", "finish", "--user", "alice", stdin=location + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1
    assert "alice" in done.stdout
    assert all(scope in done.stdout for scope in LONG_TERM_SCOPES)
    assert "enroll.completed" in [e["event"] for e in log_events(done.stderr)]

    listed = cli("users", "list", "--format", "json")
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
    cli.running.sim.queue_consent("svc-bob", ["openid", STATS_SCOPE])
    verifier = "v" * 43
    challenge = challenge_s256(Secret(verifier))
    url = (
        f"{cli.running.auth_url}/oidc/auth?client_id={DEMO_CLIENT_ID}&response_type=code"
        f"&redirect_uri={REDIRECT}&scope=openid%20{STATS_SCOPE}&state=st"
        f"&code_challenge={challenge}&code_challenge_method=S256"
    )
    code = query_of(httpx.get(url).headers["location"])["code"]
    exchanged = httpx.post(
        f"{cli.running.auth_url}/oidc/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT,
            "code_verifier": verifier,
        },
        headers={"Authorization": basic(DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)},
    )
    assert exchanged.status_code == 200, exchanged.text
    user_token = exchanged.json()["access_token"]

    done = cli("enroll", "token", "--user", "bob", stdin=user_token + "\n")
    assert done.returncode == 0, done.stderr
    assert STATS_SCOPE in done.stdout
    listed = json.loads(cli("users", "list", "--format", "json").stdout)
    assert [(u["user"], u["scopes"]) for u in listed] == [("bob", [STATS_SCOPE])]
    for value in (user_token, code, cli.stored_token("bob"), DEMO_CLIENT_SECRET):
        assert value not in cli.rendered


def test_client_without_the_mode_exits_78(tmp_path: Path, running: RunningSimulator) -> None:
    """plain-client: finish reports invalid_scope as 'mode not opened, ask the operator', 78."""
    cli = make_cli(tmp_path, running, PLAIN_CLIENT_ID, PLAIN_CLIENT_SECRET)
    url = cli("enroll", "url", "--user", "alice")
    assert url.returncode == 0, url.stderr
    location = cli.consent(url.stdout.strip(), "svc-alice")
    done = cli("enroll", "finish", "--user", "alice", stdin=location)
    assert done.returncode == 78
    assert done.stdout == ""
    assert "invalid_scope" in done.stderr
    assert "not opened on this client" in done.stderr
    assert "operator" in done.stderr


def test_finish_takes_no_secret_from_an_argument(cli: Cli) -> None:
    """A code given as an argument is refused (exit 2); so is empty stdin."""
    assert cli("enroll", "finish", "--user", "alice", "the-code").returncode == 2
    empty = cli("enroll", "finish", "--user", "alice", stdin="")
    assert empty.returncode == 2
    assert "stdin" in empty.stderr
    assert cli("enroll", "token", "--user", "alice", "a-token").returncode == 2


def test_finish_refuses_a_reused_redirect(cli: Cli) -> None:
    """Feeding the same redirect twice: the second finish exits 2 with a clear message."""
    location = cli.enroll("alice", "svc-alice")
    again = cli("enroll", "finish", "--user", "alice", stdin=location)
    assert again.returncode == 2
    assert "already used" in again.stderr
    assert query_of(location)["code"] not in cli.rendered


def test_users_table_drop_and_forget(cli: Cli) -> None:
    """users list (table), drop (DELETE upstream by the client), forget, unknown user exit 2."""
    cli.enroll("alice", "svc-alice")
    cli.enroll("bob", "svc-bob")
    table = cli("users", "list")
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split()[:3] == ["USER", "STATE", "TOKEN"]
    assert [line.split()[:3] for line in lines] == [
        ["alice", "active", "yes"],
        ["bob", "active", "yes"],
    ]
    assert len({line.index("active") for line in lines}) == 1  # aligned

    cli.running.sim.clear_requests()
    dropped = cli("users", "drop", "--user", "alice")
    assert dropped.returncode == 0, dropped.stderr
    assert "HTTP 204" in dropped.stdout
    deletes = [r for r in cli.running.sim.requests() if r.method == "DELETE"]
    assert [(d.client, d.user, d.auth) for d in deletes] == [
        (DEMO_CLIENT_ID, "svc-alice", "long_term")
    ]

    forgot = cli("users", "forget", "--user", "bob")
    assert forgot.returncode == 0, forgot.stderr
    assert "purged" in forgot.stdout
    listed = {u["user"]: u for u in json.loads(cli("users", "list", "--format", "json").stdout)}
    assert (listed["alice"]["state"], listed["alice"]["has_token"]) == ("dropped", False)
    assert (listed["bob"]["state"], listed["bob"]["has_token"]) == ("dropped", False)

    unknown = cli("users", "drop", "--user", "nobody")
    assert unknown.returncode == 2
    assert "no user 'nobody'" in unknown.stderr
    assert "dspa_" not in cli.rendered


def test_results_export(cli: Cli) -> None:
    """results export prints one JSON object per stored result; an unknown --user exits 2."""
    cli.enroll("alice", "svc-alice")
    now = datetime.now(UTC).replace(microsecond=0)
    with cli.store() as store:
        row = store.get_user("alice")
        assert row is not None
        store.apply(
            [
                UserUpdate(
                    user_id=row.id,
                    state="active",
                    next_due_at=now + timedelta(hours=1),
                    consecutive_failures=0,
                    last_outcome="ok",
                    last_polled_at=now,
                    snapshots=(
                        SnapshotWrite("latest-change", "none", None, now),
                        SnapshotWrite("stats", "ok", {"total": 3}, now),
                    ),
                )
            ]
        )
    exported = cli("results", "export", "--format", "jsonl")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert {(x["user"], x["endpoint"], x["status"]) for x in lines} == {
        ("alice", "latest-change", "none"),
        ("alice", "stats", "ok"),
    }
    stats = next(x for x in lines if x["endpoint"] == "stats")
    assert stats["payload"] == {"total": 3}
    assert stats["fetched_at"] == now.isoformat().replace("+00:00", "Z")
    assert "changed_at" in stats
    only = cli("results", "export", "--user", "alice")
    assert len(only.stdout.splitlines()) == 2
    unknown = cli("results", "export", "--user", "nobody")
    assert unknown.returncode == 2
    assert "nobody" in unknown.stderr
