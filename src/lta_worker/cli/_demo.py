"""`lta-worker demo`: the whole program in under a minute, narrated in plain sentences (the
real consent flow and `Worker` on the bundled simulator). The worker's wall clock starts a day
in the past and is moved between passes; monotonic time stays real, so the pacing is real.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import textwrap
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TextIO

from lta_worker.cli._progress import progress_for
from lta_worker.config import STATS_SCOPE, Settings, format_duration, load_settings
from lta_worker.domain import UserRow
from lta_worker.errors import UsageError
from lta_worker.protocol import READ_PATHS
from lta_worker.runtime import Runtime, SystemClock
from lta_worker.simulator import DEMO_CLIENT_ID, RunningSimulator, Simulator, start_in_thread
from lta_worker.storage import generate_key_line
from lta_worker.worker import PassResult, Worker

NAMES: Final = (
    *("ada", "alan", "barbara", "claude", "dennis", "edsger", "frances", "grace", "hedy"),
    *("john", "ken", "katherine", "linus", "margaret", "marie", "niklaus", "radia", "tim"),
    *("tony", "vint"),
)
STATS_ONLY: Final = "marie"  # grants only the statistics scope
NOTHING_RECORDED: Final = "alan"  # latest-change answers 404
INACTIVE: Final = "hedy"  # cloud sync silent for 120 days: parked
UNLINKED: Final = "claude"  # no cloud sync linked
REVOKER: Final = "ken"  # revokes access before pass 2
# How the simulator's accounts of the special users differ from a plain one.
ACCOUNTS: Final[dict[str, dict[str, Any]]] = {
    NOTHING_RECORDED: {"payloads": {"latest-change": None}},
    INACTIVE: {"last_sync_age_days": 120},
    UNLINKED: {"linked": False},
}
TIGHT_BUDGET: Final = 30
WINDOW_S: Final = 10
RELAXED_BUDGET: Final = 600
REDIRECT_URI: Final = "http://127.0.0.1/lta/callback"
WIDTH: Final = 88


class OffsetClock(SystemClock):
    """Wall time is real time plus an offset the demo advances; monotonic time is real."""

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self.offset = offset

    def now(self) -> datetime:
        """Real UTC time plus the offset."""
        return super().now() + self.offset

    def advance(self, delta: timedelta) -> None:
        """Move the wall time forward."""
        self.offset += delta


def _private(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def write_files(directory: Path, running: RunningSimulator) -> Path:
    """Write the config, the client secret, a key file (both 0600); return the config path."""
    directory.mkdir(parents=True, exist_ok=True)
    secret = _private(directory / "client-secret", running.sim.client_secret(DEMO_CLIENT_ID) + "\n")
    keys = _private(directory / "token-keys", generate_key_line(datetime.now(UTC)) + "\n")
    config = directory / "config.toml"
    config.write_text(
        f"""# Written by `lta-worker demo`: the bundled simulator on {running.base_url}.
[service]
base_url = "{running.base_url}"
auth_url = "{running.auth_url}"

[client]
id = "{DEMO_CLIENT_ID}"
secret_file = "{secret}"
redirect_uri = "{REDIRECT_URI}"

[database]
url = "sqlite:///{directory / "lta.db"}"

[crypto]
key_file = "{keys}"

[poll]
interval = "1h"
parked_interval = "24h"
concurrency = 4
""",
        encoding="utf-8",
    )
    return config


async def enroll_users(settings: Settings, sim: Simulator, clock: OffsetClock) -> None:
    """Enroll every demo user through the real consent flow, as a web application would."""
    async with Runtime(settings, clock=clock) as runtime:
        enrollment = runtime.enrollment()
        for name in NAMES:
            sim.add_user(name, **ACCOUNTS.get(name, {}))
            url = enrollment.start(name)  # saves state and PKCE verifier
            sim.queue_consent(name, ["openid", STATS_SCOPE] if name == STATS_ONLY else None)
            consent = await runtime.http.get(url)  # the user's browser at the consent page
            await enrollment.finish(name, consent.headers["location"])


class Demo:
    """The narrated run; `out` receives the narration."""

    def __init__(self, out: TextIO, directory: Path, running: RunningSimulator) -> None:
        self.out = out
        self.dir = directory
        self.running = running
        self.sim = running.sim
        self.config = write_files(directory, running)
        self.settings = load_settings(self.config, {})
        self.clock = OffsetClock(-self.settings.poll.parked_interval)
        self.parked = _hours(self.settings.poll.parked_interval)

    def say(self, text: str = "", *, indent: int = 3, bullet: bool = False) -> None:
        """A paragraph of narration, wrapped; a bullet's lines hang under its text."""
        first = " " * indent + ("- " if bullet else "")
        rest = " " * (indent + (2 if bullet else 0))
        wrapped = textwrap.fill(
            text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
        )
        print(wrapped, file=self.out, flush=True)

    def bullet(self, text: str) -> None:
        """A bullet of narration."""
        self.say(text, bullet=True)

    def title(self, text: str) -> None:
        """A section title, after a blank line."""
        print(f"\n{text}", file=self.out, flush=True)

    def verbatim(self, text: str, indent: int = 3) -> None:
        """Lines shown as a command prints them (tables, commands)."""
        for line in text.splitlines():
            print(" " * indent + line, file=self.out, flush=True)

    def user(self, name: str) -> UserRow:
        """A user's row, read from the database as `users list` reads it."""
        with Runtime(self.settings) as runtime:
            row = runtime.store.get_user(name)
        assert row is not None, name
        return row

    def reads(self) -> list[Any]:
        """The simulator's log of reads since the pass began."""
        return [e for e in self.sim.requests() if e.path in READ_PATHS.values()]

    async def run(self) -> None:
        """Enroll, run three passes, show the status and how to go on."""
        print("lta-worker demo\n===============", file=self.out)
        self.say(
            "Everything runs on this machine: the bundled simulator of the Long Term Access "
            f"service on {self.running.base_url} (port {self.running.port}), a configuration "
            f"and a SQLite database in {self.dir}, 20 users and three passes of the worker. "
            "The worker's clock starts a day in the past and the demo moves it forward "
            "between passes, so a day goes by in seconds and the last pass happens now. "
            "The worker's JSON log goes to worker.log there; this screen tells the story.",
            indent=0,
        )
        began = time.monotonic()
        await enroll_users(self.settings, self.sim, self.clock)
        self._enrolled(time.monotonic() - began)
        async with Worker(self.settings, clock=self.clock) as worker:
            await self._pass_1(worker)
            await self._pass_2(worker)
            await self._pass_3(worker)
        self._show_status()
        self._outro()

    def _enrolled(self, took: float) -> None:
        self.title("1. Enrolling 20 users through the real consent flow")
        self.say(
            "For each user the worker makes a consent URL (a state and a PKCE challenge), the "
            "simulator's consent page approves it and redirects back with a code, and the "
            "worker exchanges the code at once, creates the user's long term token and "
            f"stores it encrypted. {len(NAMES)} users enrolled in {took:.1f} s. Among them:"
        )
        self.bullet(f"{STATS_ONLY} ticked only the statistics scope;")
        self.bullet(f"{NOTHING_RECORDED} has nothing recorded yet;")
        self.bullet(f"{INACTIVE}'s cloud sync has been silent for 120 days;")
        self.bullet(f"{UNLINKED} has no cloud sync linked at all.")

    async def _pass(self, n: int, worker: Worker, *, progress: bool = False) -> PassResult:
        self.sim.clear_requests()
        if progress:
            with progress_for(self.out, worker.clock) as on_progress:
                result = await worker.run_pass(on_progress=on_progress)
        else:
            result = await worker.run_pass()
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(result.counts.items()))
        too_many = sum(1 for e in self.reads() if e.status == 429)
        self.say(
            f"Pass {n} read {result.users} users with {result.reads} requests in "
            f"{result.wall_s:.1f} s ({kinds}) and {result.stopped} with exit code "
            f"{result.exit_code}. Answers 429 (too many requests): {too_many}."
        )
        return result

    async def _pass_1(self, worker: Worker) -> None:
        self.sim.configure(budget=TIGHT_BUDGET, window=WINDOW_S)
        self.title("2. Pass 1, on a tight budget")
        self.say(
            f"The simulator allows this client {TIGHT_BUDGET} requests per {WINDOW_S} s "
            "window (the real service counts about 120 per hour). The worker reads the "
            "RateLimit headers of every answer, keeps 10% in reserve for the client's other "
            "traffic and spreads the rest evenly over the window instead of bursting."
        )
        await self._pass(1, worker, progress=True)
        per_window = Counter(int(e.at.timestamp() // WINDOW_S) for e in self.reads())
        counts = [per_window[w] for w in sorted(per_window)]
        seen = worker.pacer.budget_seen(self.clock.now())
        self.say(
            f"Requests per {WINDOW_S} s window: {', '.join(map(str, counts))}, never more "
            f"than the {TIGHT_BUDGET} allowed less the reserve. Budget last seen: "
            + ("none" if seen is None else f"{seen.remaining} of {seen.limit} left.")
        )
        self.bullet(
            f"{NOTHING_RECORDED}: latest-change answered 404, stored as "
            f"`{self.user(NOTHING_RECORDED).last_outcome}`: nothing recorded, his access is "
            "fine and his statistics were read."
        )
        called = sorted({e.path.rsplit("/", 1)[-1] for e in self.reads() if e.user == STATS_ONLY})
        self.bullet(f"{STATS_ONLY}: only {' and '.join(called)} was called.")
        self.bullet(
            f"{INACTIVE}: 403 CloudSyncInactive, so she is {self.user(INACTIVE).state}: her "
            f"token is kept and she is re-checked every {self.parked}."
        )
        self.bullet(
            f"{UNLINKED}: 401 NoCloudSyncLinked, so he is {self.user(UNLINKED).state}: token "
            f"kept, re-checked every {self.parked} too."
        )

    async def _pass_2(self, worker: Worker) -> None:
        interval = self.settings.poll.interval
        self.title(f"3. Pass 2, {_hours(interval)} later: {REVOKER} revokes access")
        self.sim.revoke(REVOKER)
        self.sim.set_sync(INACTIVE, last_sync_age_days=0)
        self.clock.advance(interval)
        self.sim.configure(budget=RELAXED_BUDGET)
        self.say(
            f"{REVOKER} revoked this client's access from his account page, and {INACTIVE} "
            f"synced her device again. The demo moves the worker's clock {_hours(interval)} "
            "(poll.interval) forward, so every active user is due again. To keep the demo "
            f"short the simulator now allows {RELAXED_BUDGET} requests per window; the worker "
            "goes on pacing by what it saw until the current window ends."
        )
        await self._pass(2, worker)
        ken = self.user(REVOKER)
        self.bullet(
            f"{REVOKER}: 401 PermanentAccessRevoked. The worker deleted his token at once "
            f"(state {ken.state}, token held: {'yes' if ken.token else 'no'}); he is never "
            "read again."
        )
        called = any(e.user == INACTIVE for e in self.reads())
        self.bullet(
            f"{INACTIVE} was {'read' if called else 'not called'}: parked users wait for "
            f"their re-check, {self.parked} after the last one."
        )

    async def _pass_3(self, worker: Worker) -> None:
        later = self.settings.poll.parked_interval - self.settings.poll.interval
        self.clock.advance(later)
        self.title(f"4. Pass 3, {self.parked} after pass 1: {INACTIVE} is back")
        self.say(
            f"The clock moves {_hours(later)} further: the parked and unlinked users are due "
            "for their re-check, and every active user once more."
        )
        await self._pass(3, worker)
        self.bullet(
            f"{INACTIVE}: her read succeeded, so she is {self.user(INACTIVE).state} again, by "
            "herself, with the token she enrolled with."
        )
        self.bullet(
            f"{UNLINKED} is still {self.user(UNLINKED).state}: nothing changed on his side."
        )

    def _show_status(self) -> None:
        from lta_worker.cli._status_cmd import render_table
        from lta_worker.cli._users_cmd import render_table as users_table
        from lta_worker.cli._users_cmd import table_rows
        from lta_worker.report import collect_status

        self.title("5. What `lta-worker status` shows now")
        self.verbatim(render_table(collect_status(self.settings, self.clock.now())))
        self.title("6. A few rows of `lta-worker users list`")
        shown = (REVOKER, INACTIVE, UNLINKED, NOTHING_RECORDED, STATS_ONLY, "ada")
        with Runtime(self.settings) as runtime:
            rows = [r for r in runtime.store.list_users() if r.user in shown]
        self.verbatim(users_table(table_rows(rows)))

    def _outro(self) -> None:
        program = _program()
        cmd = f"{program} --config {self.config}"
        self.title("How to go on")
        self.say(f"The configuration, keys, database and log stay in {self.dir}:")
        self.verbatim(
            "\n".join(f"{cmd} {rest}" for rest in ("users list", "results export", "status")),
            indent=5,
        )
        due = self.clock.now() + self.settings.poll.interval
        self.say(
            "`run` makes one pass over the users who are due (here nobody is before "
            f"{due:%H:%M} UTC, poll.interval after pass 3). It needs the simulator on the "
            f"same port ({self.running.port}) again:"
        )
        self.verbatim(f"{program} simulator serve --port {self.running.port}\n{cmd} run", 5)
        self.say(
            "The simulator keeps its state in memory, so a fresh one does not know these "
            "users or their tokens: `run` then meets plain 401s and stops with exit code 78 "
            "(its circuit breaker, as with a wrong client secret), changing no user. "
            "`lta-worker demo --keep-serving` keeps the demo's own simulator, and the "
            "tokens it issued, up after the demo until Ctrl-C."
        )
        self.say(f"When done: rm -r {self.dir}")


def _hours(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    if hours.is_integer():
        return f"{hours:g} hour" + ("" if hours == 1 else "s")
    return format_duration(delta)


def _program() -> str:
    """How to call lta-worker here: its name when on PATH, else the full path."""
    if shutil.which("lta-worker"):
        return "lta-worker"
    script = Path(sys.executable).parent / "lta-worker"
    return str(script) if script.exists() else f"{sys.executable} -m lta_worker"


def run_demo(out: TextIO, directory: Path | None = None, *, keep_serving: bool = False) -> int:
    """Run the narrated demo into `out`; return the exit code (0).

    Raises:
        UsageError: `directory` exists and is not empty.
    """
    import anyio

    from lta_worker.logs import configure_logging

    if directory is not None and directory.exists() and any(directory.iterdir()):
        raise UsageError(f"--dir {str(directory)!r} is not empty", hint="name a new directory")
    directory = directory or Path(tempfile.mkdtemp(prefix="lta-worker-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with (
        (directory / "worker.log").open("a", encoding="utf-8") as log_stream,
        start_in_thread(Simulator()) as running,
    ):
        configure_logging("info", "json", log_stream)
        demo = Demo(out, directory, running)
        anyio.run(demo.run)
        demo.title(f"The demo took {time.monotonic() - began:.1f} s.")
        if keep_serving:
            demo.say(f"The simulator keeps serving on {running.base_url}; Ctrl-C stops it.")
            try:
                running.wait()
            except KeyboardInterrupt:
                demo.say("Stopped.")
    return 0
