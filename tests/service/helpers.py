"""Helpers for the service tests: the simulator served on loopback, config files, users
enrolled through the real consent flow, a fake systemd notify socket, and the CLI as a child
process whose JSON log goes to a file."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from lta_worker.config import Settings, load_settings
from lta_worker.runtime import Runtime
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET, RunningSimulator
from lta_worker.storage import Store, generate_key_line
from support import FIXED_POLL

REDIRECT = "http://127.0.0.1/lta/callback"
Message = dict[str, str]


def write_private(path: Path, text: str) -> Path:
    """Write a file readable by its owner only (mode 0600)."""
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o600)
    return path


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child `lta-worker`: none of the caller's LTA_WORKER_* or systemd
    variables, plus `extra`."""
    dropped = {"CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_") and k not in dropped
    }
    env.update(extra)
    return env


@dataclass
class World:
    """A served simulator and a config directory pointing at it."""

    running: RunningSimulator
    tmp: Path
    poll: dict[str, str] = field(default_factory=dict)
    serve: dict[str, str] = field(default_factory=dict)
    extra: str = ""
    database_url: str | None = None  # else the SQLite file `database`

    def __post_init__(self) -> None:
        self.secret_file = write_private(self.tmp / "client-secret", DEMO_CLIENT_SECRET + "\n")
        self.key_file = write_private(
            self.tmp / "token-keys", generate_key_line(datetime.now(UTC)) + "\n"
        )
        self.database = self.tmp / "lta.db"
        self.config = self.tmp / "lta-worker.toml"
        self.log_file = self.tmp / "stderr.log"
        self.write_config()

    @property
    def sim(self) -> Any:
        return self.running.sim

    def config_text(self) -> str:
        def table(name: str, values: dict[str, str]) -> str:
            body = "".join(f'{k} = "{v}"\n' for k, v in values.items())
            return f"[{name}]\n{body}" if values else ""

        return f"""
[service]
base_url = "{self.running.base_url}"
auth_url = "{self.running.auth_url}"

[client]
id = "{DEMO_CLIENT_ID}"
secret_file = "{self.secret_file}"
redirect_uri = "{REDIRECT}"

[database]
url = "{self.database_url or f"sqlite:///{self.database}"}"

[crypto]
key_file = "{self.key_file}"

[log]
level = "info"
format = "json"

{table("poll", {**FIXED_POLL, **self.poll})}
{table("serve", self.serve)}
{self.extra}
"""

    def write_config(self, text: str | None = None) -> None:
        self.config.write_text(self.config_text() if text is None else text, encoding="utf-8")

    def settings(self) -> Settings:
        return load_settings(self.config, {})

    def store(self) -> Store:
        store = Store.open(f"sqlite:///{self.database}")
        store.upgrade()
        return store

    def enroll(self, users: dict[str, dict[str, Any]] | list[str]) -> None:
        """Create each account in the simulator and enroll it through the real consent flow:
        consent URL, consent queued, the URL visited over HTTP, the redirect finished."""
        accounts = users if isinstance(users, dict) else {u: {} for u in users}
        anyio.run(self._enroll, accounts)

    async def _enroll(self, accounts: dict[str, dict[str, Any]]) -> None:
        async with Runtime(self.settings()) as runtime:
            enrollment = runtime.enrollment()
            for user, wanted in accounts.items():
                account = dict(wanted)
                scopes = account.pop("scopes", None)
                self.sim.add_user(user, **account)
                url = enrollment.start(user)
                self.sim.queue_consent(user, scopes)
                answer = await runtime.http.get(url)
                assert answer.status_code == 302, answer.text
                await enrollment.finish(user, answer.headers["location"])

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run one `lta-worker --config CFG ...` command to its end."""
        return subprocess.run(
            [sys.executable, "-m", "lta_worker", "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=timeout,
            check=False,
        )

    def start_serve(self, nofile: int | None = None, **env: str) -> subprocess.Popen[bytes]:
        """Start `lta-worker --config CFG serve`; its stderr (the JSON log) goes to a file.
        `nofile` lowers the child's descriptor limit (RLIMIT_NOFILE, soft and hard) as it
        starts, long before it opens its listeners (Linux: prlimit)."""
        with self.log_file.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lta_worker", "--config", str(self.config), "serve"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=child_env(**env),
            )
        if nofile is not None:
            resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (nofile, nofile))
        return proc

    def serve_until_exit(self, timeout: float = 30.0, **env: str) -> int:
        """Start `serve`, wait for it to exit by itself and return its exit code (a child
        still running after `timeout` fails the test and is killed)."""
        proc = self.start_serve(**env)
        try:
            return proc.wait(timeout)
        finally:
            stop(proc)

    def log_lines(self) -> list[str]:
        return self.log_file.read_text(encoding="utf-8").splitlines()

    def log_events(self) -> list[dict[str, Any]]:
        """Every line of the child's stderr, each parsed as JSON (a test fails on any other)."""
        return [json.loads(line) for line in self.log_lines()]

    def wait_for_event(
        self, name: str, proc: subprocess.Popen[bytes], timeout: float = 20.0
    ) -> dict[str, Any]:
        """Poll the child's log until an event named `name` appears (the child must live)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_lines():
                if f'"event": "{name}"' in line:
                    event: dict[str, Any] = json.loads(line)
                    if event["event"] == name:
                        return event
            assert proc.poll() is None, f"the child exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"no {name} event after {timeout} s"
            time.sleep(0.05)

    def integrity(self) -> str:
        with sqlite3.connect(self.database) as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


class NotifySocket:
    """A fake `$NOTIFY_SOCKET`: a unix datagram socket bound in a short temporary directory
    (socket paths are limited to about 100 bytes)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lta-n-"))
        self.path = self.dir / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.messages: list[Message] = []

    def _receive(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        fields = (line.partition("=") for line in data.decode().splitlines() if line)
        self.messages.append({k: v for k, _, v in fields})

    def wait_for(
        self, predicate: Callable[[Message], bool], timeout: float = 20.0, *, since: int = 0
    ) -> Message:
        """The first message from index `since` on that matches; AssertionError at the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.messages[since:]:
                if predicate(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching notification in {timeout} s: {self.messages}")
            self._receive(min(left, 0.5))

    def drain(self) -> None:
        """Read whatever is already queued."""
        while True:
            before = len(self.messages)
            self._receive(0.05)
            if len(self.messages) == before:
                return

    def count(self, key: str) -> int:
        return sum(1 for m in self.messages if key in m)

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child left running by a failed test (its own pid only)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def wait_for_reads(sim: Any, count: int, timeout: float = 20.0) -> None:
    """Wait until the simulator has answered (or started answering) `count` reads."""
    deadline = time.monotonic() + timeout
    while len(reads(sim)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} reads after {timeout} s")
        time.sleep(0.05)


def reads(sim: Any) -> list[Any]:
    """The simulator's log of reads (both endpoints)."""
    return [e for e in sim.requests() if "/api/v1/history/" in e.path]
