"""The real-process harness: the simulator on a loopback port, a workspace on disk (config,
client secret, key file, database), `lta-worker` commands as child processes, their JSON log
events, and waits for events and reads. Used by tests/reliability, tests/service, tests/cli."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import httpx

from lta_worker.cli import main
from lta_worker.config import Settings, load_settings
from lta_worker.enrollment import challenge_s256
from lta_worker.runtime import Runtime
from lta_worker.secret import Secret
from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    RunningSimulator,
    Simulator,
    start_in_thread,
)
from lta_worker.storage import Store, Vault, generate_key_line, load_key_file
from support import FIXED_POLL
from support.enroll import write_private
from support.storage import stored_verifiers

REDIRECT = "http://127.0.0.1/lta/callback"
# Generous: only a hung process should ever reach it.
PROCESS_TIMEOUT = 90.0
Message = dict[str, str]


def free_port() -> int:
    """A loopback TCP port nothing listens on (just now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: Any) -> str:
    """A Python value as TOML (strings, numbers, booleans, lists of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def render_toml(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """A config file from sections of keys (a value of None leaves the key out)."""
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def child_env(**extra: str) -> dict[str, str]:
    """The caller's environment without LTA_WORKER_* or systemd variables, plus `extra`."""
    dropped = {
        "CREDENTIALS_DIRECTORY",
        "STATE_DIRECTORY",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
    }
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_") and k not in dropped
    }
    env.update(extra)
    return env


def run_here(argv: list[str], stdin: str = "", env: Mapping[str, str] | None = None) -> Output:
    """`lta-worker ARGV` in this process: `main` under `child_env`, `stdin` as standard input."""
    saved_env, saved = dict(os.environ), (sys.stdin, sys.stdout, sys.stderr)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(child_env(**(env or {})))
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        os.environ.clear()
        os.environ.update(saved_env)
    return Output(" ".join(argv), code, out.getvalue(), err.getvalue())


@dataclass
class Output:
    """What one finished command printed."""

    label: str
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        """The JSON log events in stderr."""
        out = []
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def event_names(self) -> list[str]:
        """The names of the JSON log events, in order."""
        return [str(e.get("event")) for e in self.events]


@dataclass
class Spawned:
    """A command running in the background; stdout and stderr go to files."""

    label: str
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    started: float

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status, once it exited."""
        return self.process.returncode

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.process.poll()

    def stderr(self) -> str:
        """What it printed on stderr so far."""
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float = PROCESS_TIMEOUT) -> int:
        """Wait for the exit; a process still running after `timeout` is killed (and fails)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def signal(self, signum: int) -> None:
        """Send a signal (nothing when it already exited)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    send_signal = signal

    def kill(self) -> int:
        """SIGKILL the process and reap it; return its exit status."""
        self.signal(signal.SIGKILL)
        return self.process.wait(30)

    def output(self) -> Output:
        """The finished command's output."""
        return Output(
            self.label,
            self.process.returncode,
            self.stdout_path.read_text(encoding="utf-8", errors="replace"),
            self.stderr(),
        )


def stop(proc: subprocess.Popen[bytes] | Spawned) -> None:
    """Kill a child left running by a failed test (its own pid only)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def wait_for(predicate: Callable[[], object], *, timeout: float, interval: float = 0.02) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; return whether it was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def serve_simulator(*, budget: int = 10_000_000, seed_value: int | None = None) -> RunningSimulator:
    """A simulator on a loopback port with a budget too large to matter (unless given)."""
    sim = Simulator(seed=seed_value)
    sim.configure(budget=budget, window=3600)
    return start_in_thread(sim)


def reads(sim: Simulator) -> list[Any]:
    """The simulator's log of reads (both endpoints)."""
    return [e for e in sim.requests() if "/api/v1/history/" in e.path]


def reads_seen(sim: Simulator) -> int:
    """How many reads (either endpoint) the simulator has logged."""
    return len(reads(sim))


def wait_for_reads(
    sim: Simulator, more_than: int, *, timeout: float = 30.0, run: Spawned | None = None
) -> bool:
    """Wait for more than `more_than` reads (or the end of `run`); return whether they came."""
    wait_for(lambda: reads_seen(sim) > more_than or (run is not None and run.poll() is not None),
             timeout=timeout)  # fmt: skip
    return reads_seen(sim) > more_than


@dataclass
class Workspace:
    """An operator's installation on disk against a simulator on loopback; its config is
    rendered from these files and `sections`, with the raw TOML `extra` appended."""

    running: RunningSimulator
    tmp: Path
    client_id: str = DEMO_CLIENT_ID
    client_secret: str = DEMO_CLIENT_SECRET
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: str = ""
    database_url: str | None = None  # else the SQLite file `database`
    tokens: dict[str, str] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    _spawned: int = 0

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.secret_file = write_private(self.tmp / "client-secret", self.client_secret + "\n")
        line = generate_key_line(datetime.now(UTC))
        self.key_file = write_private(self.tmp / "token-keys", line + "\n")
        self.database = self.tmp / "lta.db"
        self.config = self.tmp / "lta-worker.toml"
        self.log_file = self.tmp / "stderr.log"
        self.write_config()

    @property
    def sim(self) -> Simulator:
        """The simulator (drive it directly: faults, revocations, payloads)."""
        return self.running.sim

    @property
    def db_url(self) -> str:
        """The SQLAlchemy URL of the SQLite database."""
        return f"sqlite:///{self.database}"

    def merged(self, **sections: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The config's sections: the files, then `self.sections`, then `sections`."""
        data: dict[str, dict[str, Any]] = {
            "service": {"base_url": self.running.base_url, "auth_url": self.running.auth_url},
            "client": {
                "id": self.client_id,
                "secret_file": str(self.secret_file),
                "redirect_uri": REDIRECT,
            },
            "database": {"url": self.database_url or self.db_url},
            "crypto": {"key_file": str(self.key_file)},
            "log": {"level": "info", "format": "json"},
            "poll": dict(FIXED_POLL),
        }
        for layer in (self.sections, sections):
            for section, values in layer.items():
                data.setdefault(section, {}).update(values)
        return data

    def config_text(self) -> str:
        """The config file's text."""
        return render_toml(self.merged()) + "\n" + self.extra

    def write_config(self, text: str | None = None) -> None:
        """Rewrite the config file (from the settings, or `text` as given)."""
        self.config.write_text(self.config_text() if text is None else text, encoding="utf-8")

    def configure(self, **sections: Mapping[str, Any]) -> None:
        """Merge settings into the config file (`poll={"interval": "1s"}`) and rewrite it."""
        for section, values in sections.items():
            self.sections.setdefault(section, {}).update(values)
        self.write_config()

    def other_config(self, path: Path, **sections: Mapping[str, Any]) -> Path:
        """Another config file: this workspace's settings with `sections` merged over them."""
        path.write_text(render_toml(self.merged(**sections)) + "\n" + self.extra, "utf-8")
        return path

    def settings(self) -> Settings:
        """The settings the config file gives."""
        return load_settings(self.config, {})

    def store(self) -> Store:
        """The SQLite store, upgraded."""
        store = Store.open(self.db_url)
        store.upgrade()
        return store

    def vault(self) -> Vault:
        """A vault over the key file as it is now."""
        return Vault(load_key_file(self.key_file))

    def integrity(self) -> str:
        """SQLite's `integrity_check` of the database."""
        with sqlite3.connect(self.database) as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    def _argv(self, args: tuple[str, ...], config: Path | None) -> list[str]:
        return [sys.executable, "-m", "lta_worker", "--config", str(config or self.config), *args]

    def cli(
        self,
        *args: str,
        stdin: str = "",
        config: Path | None = None,
        timeout: float = PROCESS_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> Output:
        """Run `lta-worker --config CFG ARGS` to its end; keep what it printed."""
        done = subprocess.run(
            self._argv(args, config),
            input=stdin,
            capture_output=True,
            text=True,
            env=child_env(**(env or {})),
            timeout=timeout,
            check=False,
        )
        out = Output(" ".join(args), done.returncode, done.stdout, done.stderr)
        self.outputs.append(out)
        return out

    def here(self, *args: str, stdin: str = "", env: Mapping[str, str] | None = None) -> Output:
        """`lta-worker --config CFG ARGS` in this process (see `run_here`); keep what it printed."""
        out = run_here(["--config", str(self.config), *args], stdin, env)
        self.outputs.append(out)
        return out

    def spawn(
        self,
        *args: str,
        config: Path | None = None,
        nofile: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Spawned:
        """Start `lta-worker --config CFG ARGS` in the background (stderr: `log_file`); `nofile`
        lowers its RLIMIT_NOFILE as it starts, before it opens its listeners."""
        self._spawned += 1
        stem = self.tmp / f"proc{self._spawned:03d}"
        out_path, self.log_file = stem.with_suffix(".out"), stem.with_suffix(".err")
        with out_path.open("wb") as out, self.log_file.open("wb") as err:
            process = subprocess.Popen(
                self._argv(args, config),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=child_env(**(env or {})),
            )
        if nofile is not None:
            resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (nofile, nofile))
        return Spawned(" ".join(args), process, out_path, self.log_file, time.monotonic())

    def start_serve(self, nofile: int | None = None, **env: str) -> Spawned:
        """Start `serve` (see `spawn`)."""
        return self.spawn("serve", nofile=nofile, env=env)

    def serve_until_exit(self, timeout: float = 30.0, **env: str) -> int:
        """Start `serve` and return its exit code (killed, failing, if alive after `timeout`)."""
        return self.start_serve(**env).wait(timeout)

    def keep(self, spawned: Spawned) -> Output:
        """Record a finished background command's output with the others."""
        out = spawned.output()
        self.outputs.append(out)
        return out

    def log_lines(self) -> list[str]:
        """The lines of the last spawned command's stderr."""
        return self.log_file.read_text(encoding="utf-8").splitlines()

    def log_events(self) -> list[dict[str, Any]]:
        """Every line of that stderr, each parsed as JSON (a test fails on any other)."""
        return [json.loads(line) for line in self.log_lines()]

    def wait_for_event(
        self, name: str, proc: subprocess.Popen[bytes] | Spawned, timeout: float = 20.0
    ) -> dict[str, Any]:
        """Poll that stderr until an event named `name` appears (the child must live)."""
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

    def enroll(
        self,
        users: Mapping[str, Mapping[str, Any]] | Iterable[str],
        scopes: list[str] | None = None,
        *,
        sim_user: str | None = None,
    ) -> None:
        """Create each account in the simulator (`{user: add_user kwargs}` or names), enroll it
        in-process through the real consent flow and remember its token; with `sim_user`, each
        local user consents as that existing account instead (rotating its token)."""
        accounts = dict(users) if isinstance(users, Mapping) else {u: {} for u in users}
        if sim_user is None:
            for user, account in accounts.items():
                self.sim.add_user(user, **{k: v for k, v in account.items() if k != "scopes"})
        anyio.run(self._enroll, accounts, scopes, sim_user)

    async def _enroll(
        self, accounts: dict[str, Mapping[str, Any]], scopes: list[str] | None, sim_user: str | None
    ) -> None:
        async with Runtime(self.settings()) as runtime:
            enrollment = runtime.enrollment()
            for user, account in accounts.items():
                url = enrollment.start(user)
                self.sim.queue_consent(sim_user or user, account.get("scopes", scopes))
                answer = await runtime.http.get(url)
                assert answer.status_code == 302, answer.text
                await enrollment.finish(user, answer.headers["location"])
        vault = self.vault()
        with Store.open(self.database_url or self.db_url) as store:
            for user in accounts:
                row = store.get_user(user)
                assert row is not None and row.token is not None
                self.tokens[user] = vault.decrypt(row.token, user=user).reveal()

    def plant_tokens(self, count: int, prefix: str = "planted") -> None:
        """Store `count` users with random tokens the service does not know (never read)."""
        vault = self.vault()
        now = datetime.now(UTC)
        far = now.replace(year=now.year + 1)  # never due
        with self.store() as store:
            for i in range(count):
                user = f"{prefix}{i:04d}"
                token = "dspa_" + secrets.token_urlsafe(32)
                encrypted = vault.encrypt(Secret(token), user=user)
                store.store_token(user, encrypted, ["cloud-sync.permanent.stats"], now, far)
                self.tokens[user] = token

    @property
    def rendered(self) -> str:
        """Everything every `cli` command printed, stdout and stderr."""
        return "\n".join(o.stdout + "\n" + o.stderr for o in self.outputs)

    def stored_token(self, user: str) -> str:
        """The plaintext of `user`'s stored token."""
        with Store.open(self.db_url) as store:
            row = store.get_user(user)
        assert row is not None and row.token is not None
        return self.vault().decrypt(row.token, user=user).reveal()

    def verifiers(self) -> list[str]:
        """The PKCE verifiers of the pending enrollments, decrypted from the database."""
        with Store.open(self.db_url) as store:
            return stored_verifiers(store, self.vault())

    def consent(self, url: str, sim_user: str, scopes: list[str] | None = None) -> str:
        """`sim_user` approves the consent at `url`; the redirect the browser is sent to."""
        self.sim.queue_consent(sim_user, scopes)
        response = httpx.get(url, follow_redirects=False)
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def enroll_by_cli(self, user: str, sim_user: str) -> str:
        """Enroll through `enroll url` and `enroll finish`; return the redirect used."""
        url = self.here("enroll", "url", "--user", user)
        assert url.returncode == 0, url.stderr
        location = self.consent(url.stdout.strip(), sim_user)
        done = self.here("enroll", "finish", "--user", user, stdin=location + "\n")
        assert done.returncode == 0, done.stderr
        return location

    def user_access_token(
        self, sim_user: str, scope: str, verifier: str = "v" * 43
    ) -> tuple[str, str]:
        """(user access token, authorization code) from a consent, by the OAuth flow by hand."""
        query = urlencode(
            {
                "client_id": self.client_id,
                "response_type": "code",
                "redirect_uri": REDIRECT,
                "scope": scope,
                "state": "by-hand",
                "code_challenge": challenge_s256(Secret(verifier)),
                "code_challenge_method": "S256",
            }
        )
        location = self.consent(f"{self.running.auth_url}/oidc/auth?{query}", sim_user)
        code = parse_qs(urlsplit(location).query)["code"][0]
        exchanged = httpx.post(
            f"{self.running.auth_url}/oidc/token",
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": REDIRECT,
                "code_verifier": verifier,
            },
            auth=(self.client_id, self.client_secret),
        )
        assert exchanged.status_code == 200, exchanged.text
        return exchanged.json()["access_token"], code

    def db_files(self) -> list[Path]:
        """The database and its companions (-wal, -shm, lock) that exist now."""
        names = [self.database.name + s for s in ("", "-wal", "-shm", ".lock")]
        return [p for p in (self.database.with_name(n) for n in names) if p.exists()]


class NotifySocket:
    """A fake `$NOTIFY_SOCKET` in a short temporary directory (socket paths: about 100 bytes)."""

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
        """How many messages carried `key`."""
        return sum(1 for m in self.messages if key in m)

    def close(self) -> None:
        """Close the socket and remove its directory."""
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)
