"""Shared pieces of the benchmarks: figures, the machine, workspaces, the simulator process.

Every wait here is bounded (a timeout or a count); processes started here are stopped by
their own handle.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from lta_worker.protocol import LONG_TERM_SCOPES

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SIM_START_TIMEOUT_S = 600.0
# How big a run is: `full` (the README's figures), `quick` (smaller, a few minutes), or
# `smoke` (tiny sizes, no targets: CI checks that every benchmark still runs and reports).
Size = Literal["full", "quick", "smoke"]
SIZES: tuple[Size, ...] = ("full", "quick", "smoke")


# -- figures --------------------------------------------------------------------------------


@dataclass
class Figure:
    """One line of the results table.

    Attributes:
        bench: `B1` .. `B4`.
        name: What is measured (stable: the README and results.json use it).
        value: The measured figure.
        unit: Its unit (`s`, `ms`, `MB`, `x`, `reads/s`, ...).
        target: The target as text (`>= 0.85`), or "" for a figure shown for context.
        met: Whether the target is met (None without a target).
        note: A short remark (how it was measured, the gap when missed).
    """

    bench: str
    name: str
    value: float | int | str | None
    unit: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class BenchResult:
    """What one benchmark returns: its figures and any details for results.json."""

    bench: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # Sections that results.json holds beside `figures` and `details` (B5's `workloads`).
    extra: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        name: str,
        value: float | int | str | None,
        unit: str = "",
        *,
        at_least: float | None = None,
        at_most: float | None = None,
        note: str = "",
    ) -> Figure:
        """Add a figure; `at_least`/`at_most` make it a target."""
        target, met = "", None
        if at_least is not None:
            target, met = f">= {at_least:g}", _num(value) >= at_least
        elif at_most is not None:
            target, met = f"<= {at_most:g}", _num(value) <= at_most
        figure = Figure(self.bench, name, value, unit, target, met, note)
        self.figures.append(figure)
        return figure


def _num(value: float | int | str | None) -> float:
    if isinstance(value, int | float):
        return float(value)
    return float("nan")


def machine() -> dict[str, Any]:
    """The machine the figures were taken on."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
        memory = f"{mem_kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "unknown"
    os_name = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = f"{line.split('=', 1)[1].strip(chr(34))} ({platform.release()})"
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory": memory,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": os_name,
    }


def fmt_value(value: float | int | str | None) -> str:
    """A figure as the table shows it."""
    if value is None:
        return "-"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def render_table(results: Iterable[BenchResult]) -> str:
    """The results as a plain-text table (name, figure, target, met?)."""
    rows = [("bench", "name", "figure", "target", "met?", "note")]
    for result in results:
        for f in result.figures:
            met = "" if f.met is None else ("yes" if f.met else "NO")
            value = fmt_value(f.value) + (f" {f.unit}" if f.unit else "")
            rows.append((f.bench, f.name, value, f.target, met, f.note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        cells = [row[c].ljust(widths[c]) if c != 2 else row[c].rjust(widths[c]) for c in range(5)]
        lines.append("  ".join([*cells, row[5]]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_results(path: Path, info: dict[str, Any], results: list[BenchResult]) -> None:
    """Write results.json: the machine, the run's options, and every figure and detail."""
    data = {
        **info,
        "benchmarks": {
            r.bench: {
                "title": r.title,
                "seconds": round(r.seconds, 1),
                "figures": [asdict(f) for f in r.figures],
                "details": r.details,
                **r.extra,
            }
            for r in results
        },
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


# -- small measuring helpers ----------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    """The median (of at least one value)."""
    return statistics.median(list(values))


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    From VmHWM in /proc/self/status: the high-water mark of this program's own memory.
    `ru_maxrss` is not used: on Linux it survives exec, so a child started by a big parent
    reports the parent's size at fork when that was larger.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    """Current resident set size of this process, in MiB (from /proc/self/statm)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def log(message: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


@contextmanager
def quiet_logs(level: str = "info") -> Iterator[None]:
    """The worker's JSON logs, rendered in full as in production, into /dev/null."""
    from lta_worker.logs import configure_logging, reset_logging

    with open(os.devnull, "w") as sink:
        configure_logging(level, "json", stream=sink)
        try:
            yield
        finally:
            reset_logging()


# -- a workspace: key file, secret file, database, config -----------------------------------


class Workspace:
    """A temporary directory with what a worker needs: key file, client secret, SQLite db."""

    def __init__(self, name: str) -> None:
        from lta_worker.simulator import DEMO_CLIENT_SECRET
        from lta_worker.storage import generate_key_line

        self._tmp = tempfile.TemporaryDirectory(prefix=f"lta-bench-{name}-")
        self.path = Path(self._tmp.name)
        self.secret_file = self.path / "client-secret"
        self.secret_file.write_text(DEMO_CLIENT_SECRET + "\n")
        os.chmod(self.secret_file, 0o600)
        self.key_file = self.path / "token-keys"
        self.key_file.write_text(generate_key_line(datetime.now(UTC)) + "\n")
        os.chmod(self.key_file, 0o600)
        self.db_path = self.path / "lta.db"
        self.db_url = f"sqlite:///{self.db_path}"

    def data(self, base_url: str, auth_url: str, **sections: dict[str, Any]) -> dict[str, Any]:
        """The settings as a plain mapping (sections given here are merged in)."""
        from lta_worker.simulator import DEMO_CLIENT_ID

        data: dict[str, dict[str, Any]] = {
            "service": {"base_url": base_url, "auth_url": auth_url},
            "client": {"id": DEMO_CLIENT_ID, "secret_file": str(self.secret_file)},
            "database": {"url": self.db_url},
            "crypto": {"key_file": str(self.key_file)},
            "poll": {"concurrency": 8},
            "log": {"level": "info", "format": "json"},
        }
        for section, values in sections.items():
            data[section] = {**data.get(section, {}), **values}
        return data

    def settings(self, base_url: str, auth_url: str, **sections: dict[str, Any]) -> Any:
        """Validated `Settings` for this workspace and a simulator's URLs."""
        from lta_worker.config import build_settings

        return build_settings(self.data(base_url, auth_url, **sections))

    def write_config(self, base_url: str, auth_url: str, **sections: dict[str, Any]) -> Path:
        """Write config.toml (for CLI runs) and return its path."""
        lines = []
        for section, values in self.data(base_url, auth_url, **sections).items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
            lines.append("")
        path = self.path / "config.toml"
        path.write_text("\n".join(lines))
        return path

    def cleanup(self) -> None:
        """Remove the directory."""
        self._tmp.cleanup()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def store_tokens(
    settings: Any,
    tokens: Iterable[tuple[str, str]],
    due_at: datetime | None = None,
    scopes: Sequence[str] = LONG_TERM_SCOPES,
) -> int:
    """Store each user's token the way enrollment does (Vault.encrypt + Store.store_token)."""
    from lta_worker.secret import Secret
    from lta_worker.storage import Store, Vault

    vault = Vault.from_settings(settings)
    now = datetime.now(UTC)
    due = due_at or now - timedelta(minutes=1)
    count = 0
    with Store.open(settings.database.url) as store:
        store.upgrade()
        for user, token in tokens:
            sealed = vault.encrypt(Secret(token), user=user)
            store.store_token(user, sealed, scopes, now, due)
            count += 1
    return count


def bulk_store_tokens(
    settings: Any,
    tokens: Iterable[tuple[str, str]],
    due_at: datetime | None = None,
    scopes: Sequence[str] = LONG_TERM_SCOPES,
) -> int:
    """Store many tokens in one transaction: the same rows `store_token` writes, in bulk."""
    from sqlalchemy import insert

    from lta_worker.secret import Secret
    from lta_worker.storage import Store, User, Vault

    vault = Vault.from_settings(settings)
    now = datetime.now(UTC)
    due = due_at or now - timedelta(minutes=1)
    rows = []
    for user, token in tokens:
        sealed = vault.encrypt(Secret(token), user=user)
        rows.append(
            {
                "user": user,
                "state": "active",
                "token_ciphertext": sealed.ciphertext,
                "token_key_id": sealed.key_id,
                "scopes": list(scopes),
                "denied": {},
                "enrolled_at": now,
                "next_due_at": due,
                "consecutive_failures": 0,
            }
        )
    with Store.open(settings.database.url) as store:
        store.upgrade()
        with store.database.write() as conn:
            for start in range(0, len(rows), 10_000):
                conn.execute(insert(User), rows[start : start + 10_000])
    return len(rows)


def make_all_due(db_path: Path) -> None:
    """Make every user with a token due a minute ago, with no lease (between passes)."""
    import sqlite3

    due = (datetime.now(UTC) - timedelta(minutes=1)).replace(tzinfo=None)
    con = sqlite3.connect(db_path)
    try:
        with con:
            con.execute(
                "UPDATE users SET next_due_at = ? WHERE token_ciphertext IS NOT NULL",
                (due.isoformat(sep=" ", timespec="microseconds"),),
            )
            drop_leases(con)
    finally:
        con.close()


def drop_leases(con: Any, owner: str | None = None) -> None:
    """Delete the leases (of `owner` only, when given) with a sqlite3 connection, whatever
    the schema: `user_leases` since migration 0007, columns of `users` before it (so that
    this bench code can measure an older version too)."""
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master")}
    where, params = ("WHERE owner = ?", (owner,)) if owner else ("", ())
    if "user_leases" in tables:
        con.execute(f"DELETE FROM user_leases {where}", params)  # noqa: S608 - constants
    else:
        where = where.replace("owner", "lease_owner") or "WHERE lease_owner IS NOT NULL"
        con.execute(
            f"UPDATE users SET lease_owner = NULL, lease_expires_at = NULL {where}",  # noqa: S608
            params,
        )


# -- the simulator in a child process -------------------------------------------------------


class SimProcess:
    """`bench/simproc.py` in a child process: enrolls users, then serves on loopback.

    Args:
        workdir: Where the tokens file goes.
        users: How many users to enroll (ids `u-0000000`, ...).
        budget: Requests per window.
        window: Window length in seconds.
    """

    def __init__(
        self,
        workdir: Path,
        users: int,
        *,
        budget: int = 10**9,
        window: int = 3600,
        scopes: Sequence[str] = LONG_TERM_SCOPES,
    ) -> None:
        self.tokens_path = workdir / "sim-tokens.tsv"
        self.users = users
        self.scopes = tuple(scopes)
        self.budget = budget
        self.window = window
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.auth_url = ""

    def start(self) -> SimProcess:
        """Start the child and wait (bounded) until it listens."""
        cmd = [PYTHON, "-m", "bench.simproc", "--budget", str(self.budget)]
        cmd += ["--window", str(self.window), "--users", str(self.users)]
        cmd += ["--tokens", str(self.tokens_path), "--scopes", ",".join(self.scopes)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = _readline(self.proc.stdout, SIM_START_TIMEOUT_S)
        if not line:
            self.stop()
            raise RuntimeError("the simulator process did not start")
        urls = json.loads(line)
        self.base_url, self.auth_url = urls["base_url"], urls["auth_url"]
        return self

    def tokens(self) -> list[tuple[str, str]]:
        """The enrolled (user, token) pairs."""
        from bench.simproc import read_tokens

        return read_tokens(self.tokens_path)

    def stop(self) -> None:
        """Close its stdin (it exits), then wait; kill it (by its own handle) if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _readline(stream: IO[str] | None, timeout: float) -> str:
    import select

    if stream is None:
        return ""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([stream], [], [], min(left, 1.0))
        if ready:
            return stream.readline()
    return ""
