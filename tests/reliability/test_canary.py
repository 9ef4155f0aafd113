"""Canary scan: plant every secret (client secret, tokens, codes, verifiers, key material), run
every command and fault, and find no secret nor any 8-character piece of one in any output or
database file (`keys generate` may print keys; `state` and the PKCE challenge are public)."""

from __future__ import annotations

import base64
import secrets
import shutil
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bench.faultproxy import FaultProxy

from lta_worker.domain import EncryptedToken
from lta_worker.simulator import RunningSimulator
from support.enroll import query_of
from support.process import Workspace, reads_seen, wait_for, write_private

from .crash import deploy, seed

WINDOW = 8
DUE_AGAIN_S = 0.35  # poll.interval is 0.3s: every user is due again after this
CLIENT_ID = "canary-client"


@dataclass
class Canaries:
    """Planted secrets by name, and where each may legitimately appear."""

    values: dict[str, str] = field(default_factory=dict)
    allowed_in: dict[str, set[str]] = field(default_factory=dict)

    def plant(self, name: str, value: str, *, allowed_in: set[str] | None = None) -> str:
        """Remember a secret (at least WINDOW characters) to search for."""
        assert len(value) >= WINDOW, name
        self.values[name] = value
        self.allowed_in[name] = allowed_in or set()
        return value

    def scan(self, where: str, data: str | bytes) -> list[str]:
        """Every secret, or 8-character piece of one, found in `data`."""
        hits = []
        for name, value in self.values.items():
            if where in self.allowed_in[name]:
                continue
            for i in range(len(value) - WINDOW + 1):
                piece = value[i : i + WINDOW]
                needle: str | bytes = piece if isinstance(data, str) else piece.encode()
                if needle in data:  # type: ignore[operator]
                    hits.append(f"{name} (piece {i}: {piece!r}) in {where}")
                    break
        return hits


def _user_access_token(d: Workspace, canaries: Canaries, sim_user: str) -> str:
    """A user access token from a long term consent, by the OAuth flow done by hand."""
    verifier = canaries.plant("PKCE verifier (by hand)", secrets.token_urlsafe(48))
    scope = "openid cloud-sync.permanent.latest-change cloud-sync.permanent.stats"
    token, code = d.user_access_token(sim_user, scope, verifier)
    canaries.plant("authorization code (by hand)", code)
    return canaries.plant("user access token", token)


def _copy_db_files(d: Workspace, label: str, into: list[tuple[str, bytes]]) -> None:
    """Keep the bytes of the database files as they are now (the -wal and -shm included)."""
    for path in d.db_files():
        into.append((f"{path.name} ({label})", path.read_bytes()))


@pytest.fixture
def deployment(tmp_path: Path, running: RunningSimulator) -> Workspace:
    """A client made for this test, with a secret nobody else knows."""
    running.sim.reset()
    running.sim.configure(budget=10_000_000, window=3600)
    running.sim.add_client(CLIENT_ID, "cs_" + secrets.token_urlsafe(30), long_term=True)
    return deploy(
        tmp_path,
        running,
        client_id=CLIENT_ID,
        client_secret=running.sim.client_secret(CLIENT_ID),
        service={"read_timeout": "0.5s"},
        poll={"interval": "0.3s", "backoff_base": "0.2s", "lease_duration": "1s"},
        ratelimit={"fallback_per_hour": 360_000},
    )


def test_no_secret_reaches_any_output_or_database_file(deployment: Workspace) -> None:
    """Every command and fault scenario: 0 occurrences of any planted secret, or of any
    8-character piece of one, in stdout, stderr, rendered logs, errors and database files."""
    d, sim = deployment, deployment.sim
    canaries = Canaries()
    canaries.plant("client secret", d.client_secret)
    basic = base64.b64encode(f"{CLIENT_ID}:{d.client_secret}".encode()).decode()
    canaries.plant("client secret, HTTP Basic form", basic)
    db_bytes: list[tuple[str, bytes]] = []

    def ok(*args: str, stdin: str = "", config: Path | None = None) -> None:
        out = d.cli(*args, stdin=stdin, config=config)
        assert out.returncode == 0, (args, out.stderr[-2000:])

    # Keys: a second key line, so tokens are under one key and rotated to the other later.
    generated = d.cli("keys", "generate")
    assert generated.returncode == 0
    with d.key_file.open("a", encoding="utf-8") as fh:
        fh.write(generated.stdout)
    ok("db", "upgrade")

    # Enrollment through the CLI: consent URL, redirect on stdin; then a replay (refused).
    url = d.cli("enroll", "url", "--user", "alice")
    (verifier,) = d.verifiers()
    canaries.plant("PKCE verifier (alice)", verifier)
    location = d.consent(url.stdout.strip(), "alice")
    canaries.plant("authorization code (alice)", query_of(location)["code"])
    ok("enroll", "finish", "--user", "alice", stdin=location + "\n")
    assert d.cli("enroll", "finish", "--user", "alice", stdin=location).returncode == 2
    # A bare code on stdin.
    url = d.cli("enroll", "url", "--user", "bob")
    canaries.plant("PKCE verifier (bob)", d.verifiers()[-1])
    code = query_of(d.consent(url.stdout.strip(), "bob"))["code"]
    canaries.plant("authorization code (bob)", code)
    ok("enroll", "finish", "--user", "bob", stdin=code + "\n")
    # A user access token on stdin; then a bogus one (refused by the service).
    ok("enroll", "token", "--user", "carol", stdin=_user_access_token(d, canaries, "carol"))
    bogus = canaries.plant("bogus user access token", "uat_" + secrets.token_urlsafe(30))
    assert d.cli("enroll", "token", "--user", "mallory", stdin=bogus).returncode != 0

    # More users, enrolled in-process, in every state a pass can lead to.
    d.enroll(["dave", "erin", "frank", "grace", "heidi"])
    d.enroll(["heidi-again"], sim_user="heidi")  # heidi's stored token stops working
    vault = d.vault()
    with sqlite3.connect(d.database) as conn:
        stored = conn.execute("SELECT user, token_ciphertext, token_key_id FROM users").fetchall()
    conn.close()
    for user, ciphertext, key_id in stored:
        token = vault.decrypt(EncryptedToken(bytes(ciphertext), key_id), user=user).reveal()
        canaries.plant(f"long term token ({user})", token)
    for line in d.key_file.read_text().splitlines():
        key_id, _, material = line.partition(":")
        canaries.plant(f"key material ({key_id})", material, allowed_in={"keys generate"})
    sim.revoke("erin")
    sim.set_sync("frank", linked=False)
    sim.set_sync("grace", last_sync_age_days=120)
    sim.set_payload("alice", "latest-change", None)

    # Passes, and what the operator looks at.
    assert d.cli("run").returncode == 0
    console = d.other_config(d.tmp / "console.toml", log={"format": "console"})
    d.cli("run", config=console)
    for args in (
        ("status",),
        ("status", "--format", "json"),
        ("users", "list"),
        ("users", "list", "--format", "json"),
        ("results", "export"),
        ("results", "export", "--user", "alice"),
    ):
        ok(*args)

    # Faults from the simulator, then from the TCP fault proxy.
    sim.seed_faults(seed())
    for kind in ("500", "drop", "broken_json", "stall"):
        sim.inject_fault(kind, rate=0.3, delay=5.0 if kind == "stall" else None)
    time.sleep(DUE_AGAIN_S)
    assert d.cli("run").returncode in (0, 75)
    sim.clear_faults()
    target = (d.running.host, d.running.port)
    fates = {"reset": 1, "truncate": 1, "garbage": 1, "close": 1, "pass": 2}
    with FaultProxy(target, fates, seed()) as proxy:
        via = d.other_config(d.tmp / "proxy.toml", service={"base_url": proxy.url})
        time.sleep(DUE_AGAIN_S)
        assert d.cli("run", config=via).returncode in (0, 75)
    # A wrong client secret: plain 401s for everyone, the breaker, exit 78.
    wrong = canaries.plant("wrong client secret", "cs_" + secrets.token_urlsafe(30))
    wrong_file = write_private(d.tmp / "wrong-secret", wrong + "\n")
    time.sleep(DUE_AGAIN_S)
    misconfigured = d.other_config(d.tmp / "wrong.toml", client={"secret_file": str(wrong_file)})
    assert d.cli("run", config=misconfigured).returncode == 78

    # kill -9 mid-pass: the WAL is left as the crash left it.
    sim.inject_fault("latency", rate=1.0, delay=0.2)
    time.sleep(DUE_AGAIN_S)
    before = reads_seen(sim)
    proc = d.spawn("run")
    assert wait_for(lambda: reads_seen(sim) > before, timeout=30)
    proc.signal(signal.SIGKILL)
    proc.wait(30)
    d.keep(proc)
    _copy_db_files(d, "after kill -9", db_bytes)

    # serve: the database files copied while it runs, then SIGTERM.
    proc = d.spawn("serve")
    assert wait_for(lambda: "pass.finished" in proc.stderr(), timeout=30), proc.stderr()
    _copy_db_files(d, "while serve runs", db_bytes)
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    d.keep(proc)
    sim.clear_faults()

    # Key rotation, drop and forget (also with the service unreachable), migrations.
    generated = d.cli("keys", "generate")
    with d.key_file.open("a", encoding="utf-8") as fh:
        fh.write(generated.stdout)
    _, _, material = generated.stdout.strip().partition(":")
    canaries.plant("key material (third)", material, allowed_in={"keys generate"})
    ok("keys", "rotate")
    ok("users", "drop", "--user", "dave")
    ok("users", "forget", "--user", "alice")
    unreachable = d.other_config(d.tmp / "down.toml", service={"auth_url": "http://127.0.0.1:9"})
    # The service unreachable: the drop is pending (exit 75), retried by `run`/`serve`.
    pending = d.cli("users", "drop", "--user", "bob", config=unreachable)
    assert pending.returncode == 75, pending.stderr[-2000:]
    assert d.cli("users", "drop", "--user", "nobody").returncode == 2
    ok("db", "upgrade")
    ok("status")
    _copy_db_files(d, "at the end", db_bytes)
    shutil.copy2(d.database, d.tmp / "final.db")

    hits: list[str] = []
    for out in d.outputs:
        hits += canaries.scan(out.label, out.stdout)
        hits += canaries.scan(out.label, out.stderr)
    for where, data in db_bytes:
        hits += canaries.scan(where, data)
    assert hits == []
    # The scan saw what it had to: every command, the three moments of the database.
    labels = {out.label for out in d.outputs}
    expected = {"run", "serve", "status", "keys rotate", "results export", "db upgrade"}
    assert expected <= labels, labels
    assert any(label.startswith("enroll finish") for label in labels)
    assert sum(1 for where, _ in db_bytes if "-wal" in where) >= 2
    print(
        f"\ncanary scan: {len(canaries.values)} secrets, {len(d.outputs)} commands, "
        f"{sum(len(o.stdout) + len(o.stderr) for o in d.outputs)} characters of output, "
        f"{sum(len(b) for _, b in db_bytes)} bytes of database files"
    )


def test_the_scan_finds_a_planted_piece() -> None:
    """The scanner itself: an 8-character piece of a secret, anywhere, is a hit."""
    canaries = Canaries()
    secret = canaries.plant("secret", "s3cr3t-" + secrets.token_urlsafe(20))
    assert canaries.scan("clean", "nothing to see here") == []
    assert canaries.scan("piece", f"xx{secret[5:13]}xx") != []
    assert canaries.scan("bytes", b"\x00" + secret[-8:].encode() + b"\x00") != []
    assert canaries.scan("seven", secret[:7]) == []
