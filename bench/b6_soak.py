"""B6 soak: N `serve` instances on one PostgreSQL database, every fault an operator meets.

N `lta-worker serve` processes, each with its own log file, on one PostgreSQL database of
their own (created on the server of `LTA_BENCH_DATABASE_URL`, dropped after), reached
through `faultproxy.FaultProxy`, against the simulator in its own process (`simproc`) with
U users and a finite budget, and POSTing their webhooks to `webhook_sink.WebhookSink`.
Among the users, two groups of `touched` (the last ones, no fault touches them) are each
one user's own trouble, which must never stop an instance: users with nothing recorded
(latest-change answers 404) and users whose token the service forgot (a token it never
issued is stored: every read a plain 401; they end `rejected`).
While they run for the set time, a fault schedule plays (fractions of the time; the
faults overlap):

- 10 %: the webhook receiver goes down, for `receiver_down_s` (minutes in the full size);
- 15 %: some users revoke their access, some are parked (cloud sync silent > 90 days);
- 20 %: the service answers 503 to the next reads (twice `touched` of them), and
  `burst_s` later a 429 burst: other traffic spends the client's whole budget, so every read
  is refused until the window ends, and again in the next windows until a read met a 429
  (`BURST_WINDOWS` at most; these 429s are the injected ones; the fleet must earn none of
  its own);
- 25 %: an instance is killed with SIGKILL mid-pass and restarted a few seconds later;
- 30 %: `users drop` and `users forget` run from the CLI (real processes) during passes;
- 35 %: half the revoked users enroll again (`enroll url`, consent, `enroll finish`),
  and some users' data changes at the service;
- 45 %: one more instance starts with its clock stepped ahead by a quarter lease
  (`bench/skewed.py`: the worker's injected clock, moved before the CLI starts);
- 50 %: every database connection is cut (the proxy closes them and refuses new ones) for
  `cut_s`, then restored; the server itself is never touched;
- 55 %: half the parked users sync again;
- 60 % (at least 5 s after the cut ends): the config file is rewritten with a shorter
  `poll.interval`, and every instance gets SIGHUP once it has started (after the cut: a
  reload checks the key ids in use in the database, and one that cannot leaves the old
  settings in force);
- 70 %: the proxy stalls every byte for `stall_s` (longer than a lease), then resumes.

Then the fleet runs two leases past the last fault, the harness waits (bounded) until the
webhook outbox is empty, every instance gets SIGTERM, and the invariants are counted, each
a figure with its target (`invariants` in the details says what was counted):

- doubles: reads (answered 200, `poll.read` lines of the instances' logs) of a user made
  while another instance held its lease, or under a lease taken over before it ended (the
  taker's clock ahead of the holder's by more than the holder's margin). Who held each
  lease when is the database's own record: a trigger the harness adds to `user_leases` in
  the soak's database logs every claim, take-over, renewal and release with the server's
  time (`LEASE_LOG_DDL`). Reads of one user by two instances close in time are no double
  when the first lease ended before the second began (a turn that failed transiently or
  was stopped is written, its lease released, and its user read again at once): counting
  pairs closer than half a lease, as B6 first did, counts those;
- 429s earned by the fleet: answers 429 in the simulator's request log outside the
  injected burst (from the budget's spending to the end of its window, plus a second);
- revoked users still holding a token (every revoked user not enrolled again);
- drops not as their command said: a confirmed drop (exit 0) must be `dropped` locally,
  without token, and revoked upstream; an unconfirmed one (exit 75) `dropping` with its
  token (or `dropped` and revoked upstream, when `serve` finished it since);
- results of forgotten users written after `forget` returned (any snapshot or history row:
  `forget` purged them before returning);
- state-change webhooks missing (a change the harness made, whose event never reached the
  receiver, or the last one received not naming the user's final state), still waiting in
  the outbox, or received out of order per user (a timestamp going back by more than the
  stepped clock's step: an event's timestamp is its writer's clock);
- instances that exited by themselves (not killed, not yet stopped by the harness);
- stored results that differ from what the simulator served, for every (user, endpoint)
  read with 200 after its last change;
- SIGHUP: instances that did not log `service.reloaded` ok, and active users due later than
  the new interval after the end (the new interval not in force).

And counts that show the faults happened: reads after the last fault, reads by the instance
with the stepped clock, injected 429s and 5xx.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench import pg
from bench.common import (
    PYTHON,
    ROOT,
    BenchResult,
    SimProcess,
    Size,
    Workspace,
    bulk_store_tokens,
    log,
)
from bench.faultproxy import FaultProxy
from bench.webhook_sink import WebhookSink
from lta_worker.domain import EVENT_TYPES

EX_TEMPFAIL = 75
READ_PATH = "/api/v1/history/"
# The simulator keeps its last 10,000 requests (`simulator.state.LOG_LIMIT`); the fleet
# makes far fewer than that in this many seconds at any budget of the plans.
COLLECT_S = 5.0
STOP_TIMEOUT_S = 30.0
# A directory: the instances' logs, the request log, the webhooks received and the lease
# log are copied there before the workspace is removed (to look into a figure).
KEEP_ENV = "LTA_BENCH_B6_KEEP"
# Beyond the stepped clock, how far two writers' clocks (and their timestamps' rounding) may
# disagree before a user's events received in order count as out of order.
CLOCK_SLACK_S = 1.0
CLI_TIMEOUT_S = 120.0
STATE_EVENTS = tuple(t for t in EVENT_TYPES if t.startswith("user."))
# The 429 burst spends the budget of this many windows at most, until the fleet met one.
BURST_WINDOWS = 4


@dataclass(frozen=True)
class SoakPlan:
    """The soak's size and its faults' lengths (seconds), and how many users each touches."""

    instances: int
    users: int
    seconds: float
    cut_s: float
    stall_s: float
    lease_s: int
    interval_s: int
    new_interval_s: int
    budget: int
    window_s: int
    receiver_down_s: float
    burst_s: float
    touched: int  # users revoked, parked, dropped, forgotten, changed: each this many


PLANS: dict[Size, SoakPlan] = {
    "full": SoakPlan(4, 20_000, 600, 40, 20, 15, 300, 200, 20_000, 60, 180, 20, 40),
    "quick": SoakPlan(4, 2_000, 180, 20, 15, 10, 60, 40, 3_000, 30, 60, 10, 16),
    "smoke": SoakPlan(2, 80, 60, 4, 8, 6, 16, 10, 400, 10, 15, 6, 6),
}


@dataclass
class Incarnation:
    """One `serve` process: its slot, its log, and how it ended."""

    slot: int
    process: subprocess.Popen[bytes]
    log: Path
    clock_offset_s: float | None = None
    killed: bool = False
    stopped: bool = False
    hupped_at: float | None = None
    restarted: bool = False  # exited 75 while starting, and started again

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Its JSON log events (of one name when given); other lines are skipped."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
        return found


@dataclass
class Fleet:
    """The `serve` processes of the soak, started from one config file."""

    ws: Workspace
    config: Path
    all: list[Incarnation] = field(default_factory=list)

    def start(self, slot: int, clock_offset_s: float | None = None) -> Incarnation:
        """Start `serve` in `slot` (with its clock stepped by `clock_offset_s` when given)."""
        path = self.ws.path / f"serve-{slot}-{len(self.all)}.log"
        launcher = ["-m", "lta_worker"]
        if clock_offset_s is not None:
            launcher = ["-m", "bench.skewed", str(clock_offset_s)]
        with path.open("wb") as sink:
            proc = subprocess.Popen(
                [PYTHON, *launcher, "--config", str(self.config), "serve"],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                env=cli_env(),
                cwd=ROOT,
            )
        one = Incarnation(slot, proc, path, clock_offset_s)
        self.all.append(one)
        return one

    def live(self, slot: int) -> Incarnation:
        return next(i for i in reversed(self.all) if i.slot == slot)

    def running(self) -> list[Incarnation]:
        return [i for i in self.all if i.process.poll() is None]

    def sighup(self) -> list[str]:
        """SIGHUP to every running instance once it has started; their logs' names."""
        names = []
        for one in self.running():
            # As systemd does (Type=notify: no reload before READY=1). `serve` holds a
            # SIGHUP sent while it starts and reloads once started, but not in the
            # interpreter's own first milliseconds, before any of its code runs.
            deadline = time.monotonic() + 2 * STOP_TIMEOUT_S
            while not one.events("service.started") and time.monotonic() < deadline:
                time.sleep(0.2)
            one.process.send_signal(signal.SIGHUP)
            one.hupped_at = time.time()
            names.append(one.log.name)
        return names

    def kill(self, slot: int) -> None:
        one = self.live(slot)
        one.killed = True
        one.process.send_signal(signal.SIGKILL)
        one.process.wait(timeout=STOP_TIMEOUT_S)

    def stop_all(self) -> list[int | None]:
        """SIGTERM to each still running, then its exit code (SIGKILL if it hangs)."""
        running = [i for i in self.all if i.process.poll() is None]
        for one in running:
            one.stopped = True
            one.process.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for one in running:
            try:
                codes.append(one.process.wait(timeout=STOP_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                one.process.kill()
                one.process.wait(timeout=STOP_TIMEOUT_S)
                codes.append(None)
        return codes

    def supervise(self) -> None:
        """Restart, as systemd's `Restart=on-failure` would, an instance that exited 75
        (temporary: the database unreachable) before it had started: a start during the
        cut. One that had started must never exit (`unexpected_exits`)."""
        for one in list(self.all):
            if one.killed or one.stopped or one.restarted or one.process.poll() != EX_TEMPFAIL:
                continue
            if one.events("service.started"):
                continue
            one.restarted = True
            self.start(one.slot, one.clock_offset_s)

    def unexpected_exits(self) -> list[dict[str, Any]]:
        """Instances that ended by themselves during the soak (not a start-up 75 restarted)."""
        return [
            {"slot": i.slot, "log": i.log.name, "code": i.process.returncode}
            for i in self.all
            if not (i.killed or i.stopped or i.restarted) and i.process.poll() is not None
        ]


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


# The soak's database records every change of a lease (the server's clock): who held which
# user's lease when, to count doubles from (see the module). Only in the soak's database.
LEASE_LOG_DDL = (
    "CREATE TABLE b6_lease_log (id bigserial PRIMARY KEY,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp(), op text NOT NULL, user_id integer,"
    " owner text, expires_at timestamptz, old_owner text, old_expires_at timestamptz)",
    "CREATE FUNCTION b6_lease_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " IF TG_OP = 'INSERT' THEN INSERT INTO b6_lease_log (op, user_id, owner, expires_at)"
    " VALUES ('claim', NEW.user_id, NEW.owner, NEW.expires_at);"
    " ELSIF TG_OP = 'UPDATE' THEN INSERT INTO b6_lease_log"
    " (op, user_id, owner, expires_at, old_owner, old_expires_at) VALUES"
    " (CASE WHEN NEW.generation = OLD.generation THEN 'renew' ELSE 'take' END,"
    " NEW.user_id, NEW.owner, NEW.expires_at, OLD.owner, OLD.expires_at);"
    " ELSE INSERT INTO b6_lease_log (op, user_id, old_owner, old_expires_at)"
    " VALUES ('end', OLD.user_id, OLD.owner, OLD.expires_at); END IF; RETURN NULL; END $$",
    "CREATE TRIGGER b6_lease_log AFTER INSERT OR UPDATE OR DELETE ON user_leases"
    " FOR EACH ROW EXECUTE FUNCTION b6_lease_log()",
)


def doubles(
    fleet: Fleet,
    lease_log: list[dict[str, Any]],
    user_ids: dict[str, int],
    started: float,
    *,
    margin_s: float,
    preempted: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The reads (200) of a user made while another instance held its lease, or under a
    lease taken over while its holder may still read (before the end it was given, by its
    holder's clock, less `margin_s`: a holder sends no read later, `worker._pass.LeaseBook`)
    (`at_s`: the read's start, in seconds from `started`; `holder`: the lease's owner then,
    None for no lease). Reads made after a drop command ended the reader's lease go to
    `preempted` when given."""
    offsets: dict[str, float] = {}  # instance id: its clock's offset (s)
    reads: list[tuple[int, float, str, dict[str, Any], str]] = []
    for one in fleet.all:
        started_as = [str(e["instance"]) for e in one.events("service.started")]
        if not started_as:
            continue  # exited while starting: it read nothing
        instance = started_as[0]  # the owner of its leases
        offsets[instance] = one.clock_offset_s or 0.0
        for event in one.events("poll.read"):
            if event.get("status") == 200:
                begun = _ts(event) - float(event.get("duration_ms") or 0) / 1000
                reads.append((user_ids[event["user"]], begun, instance, event, one.log.name))
    held: dict[int, list[tuple[float, str | None]]] = defaultdict(list)  # user: (from, owner)
    early: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    granted: dict[int, float] = {}  # user: the latest end its lease was given (real time)
    for row in lease_log:
        at, user, owner = row["at"].timestamp(), row["user_id"], row["owner"]
        held[user].append((at, owner))
        # Taken over before the end its holder was given, by the holder's clock (a taker's
        # clock ahead, or a late renewal that shortened the lease), while the holder may
        # still have been reading (it stops `margin_s` before that end).
        if (
            row["op"] == "take"
            and row["old_owner"] != owner
            and at < granted.get(user, at) - margin_s
        ):
            early[(user, str(owner))].append((at, granted[user] - margin_s))
        if row["op"] in {"claim", "take"}:
            granted.pop(user, None)
        if row["expires_at"] is not None:
            end = row["expires_at"].timestamp() - offsets.get(str(owner), 0.0)
            granted[user] = max(granted.get(user, end), end)
    found = []
    for user_id, begun, instance, event, name in reads:
        changes = held.get(user_id, [])
        before = bisect_right(changes, begun, key=lambda change: change[0])
        holder = changes[before - 1][1] if before else None
        taken_early = any(a <= begun < b for a, b in early.get((user_id, instance), []))
        # No lease, or a drop command's: `users drop` ended the pass's lease while its turn
        # was out (a lifecycle command wins; the turn's decision is discarded). No second
        # instance read the user; such reads are listed apart (`preempted_reads`).
        other = holder is not None and holder != instance and not holder.startswith("drop:")
        if holder == instance and not taken_early:
            continue
        read = {"user": event["user"], "endpoint": event["endpoint"], "log": name}
        read.update(holder=holder, taken_early=taken_early, at_s=round(begun - started, 3))
        if other or taken_early:
            found.append(read)
        elif preempted is not None:
            preempted.append(read)
    return found


def lease_log(db_url: str) -> list[dict[str, Any]]:
    """What `LEASE_LOG_DDL` recorded, oldest first."""
    return _rows(db_url, "SELECT * FROM b6_lease_log ORDER BY at, id")


def _execute(db_url: str, statements: Iterable[str]) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def request_log(base_url: str) -> list[dict[str, Any]]:
    """The simulator's request log (`GET /_sim/requests`; never a credential)."""
    with urllib.request.urlopen(base_url + "/_sim/requests", timeout=60) as answer:  # noqa: S310
        entries: list[dict[str, Any]] = json.loads(answer.read())
    return entries


class LogCollector:
    """The whole request log of a soak: the simulator keeps only its last `LOG_LIMIT`
    entries, so it is read every `COLLECT_S` seconds (fewer requests than that arrive
    meanwhile) and the reads merged, each entry once (the same time, path, user and
    status twice is one entry: its time has microseconds)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.entries: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _collect(self) -> None:
        for entry in request_log(self.base_url):
            key = (entry["at"], entry["method"], entry["path"], entry["user"], entry["status"])
            self.entries.setdefault(key, entry)

    def _run(self) -> None:
        while not self._stop.wait(COLLECT_S):
            self._collect()

    def start(self) -> LogCollector:
        self._thread.start()
        return self

    def finish(self) -> list[dict[str, Any]]:
        """Stop, read the log a last time; every entry, oldest first."""
        self._stop.set()
        self._thread.join(timeout=60)
        self._collect()
        return sorted(self.entries.values(), key=lambda e: str(e["at"]))


def cli_env() -> dict[str, str]:
    """The environment of every child: none of the caller's worker settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    env.pop("CREDENTIALS_DIRECTORY", None)
    return env


def parse_at(value: str) -> float:
    """A time of the simulator's log or a webhook (ISO 8601, UTC when naive): Unix seconds."""
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


class Control:
    """The simulator's control API (`/_sim/`): JSON in, JSON out."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - the loopback simulator
            self.base_url + "/_sim" + path, data=data, method=method
        )
        request.add_header("content-type", "application/json")
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            raw = answer.read()
        return json.loads(raw) if raw else None


@dataclass
class Cli:
    """`lta-worker` commands run as real processes on the soak's config file."""

    config: Path
    runs: list[dict[str, Any]] = field(default_factory=list)

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        started = time.time()
        proc = subprocess.run(
            [PYTHON, "-m", "lta_worker", "--config", str(self.config), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        self.runs.append(
            {
                "args": list(args),
                "code": proc.returncode,
                "started": started,
                "ended": time.time(),
                "stderr": proc.stderr[-300:],
            }
        )
        return proc


@dataclass
class Book:
    """What the harness did to whom, and when (Unix seconds): what the checks expect."""

    revoked: list[str] = field(default_factory=list)
    revoked_at: float = 0.0
    reenrolled: dict[str, int] = field(default_factory=dict)  # user: `enroll finish` exit
    parked: list[str] = field(default_factory=list)
    unparked: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # user: `users drop` exit
    forgotten: dict[str, tuple[int, float]] = field(default_factory=dict)  # (exit, returned)
    changed: dict[str, float] = field(default_factory=dict)  # user: when its data changed
    payloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # user: what it serves
    injected: list[tuple[float, float, str]] = field(default_factory=list)  # (from, to, kind)
    hupped: list[str] = field(default_factory=list)
    not_started: set[str] = field(default_factory=set)  # drops/forgets refused: no database


@dataclass
class Soak:
    """One soak's moving parts, so the schedule's steps are plain methods."""

    plan: SoakPlan
    fleet: Fleet
    proxy: FaultProxy
    sink: WebhookSink
    control: Control
    cli: Cli
    write_config: Callable[[int], Path]
    users: list[str]
    book: Book = field(default_factory=Book)
    _threads: list[threading.Thread] = field(default_factory=list)

    def group(self, index: int) -> list[str]:
        """The `index`th group of `touched` users, none in two groups: the first users, so
        the first read and due again first (at the full size a cycle outlasts the soak)."""
        n = self.plan.touched
        return self.users[index * n : (index + 1) * n]

    def background(self, target: Callable[[], None]) -> None:
        """Run a step on a thread of its own (CLI commands take seconds each)."""
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=CLI_TIMEOUT_S * 4)

    # -- the steps ------------------------------------------------------------------------

    def revoke_and_park(self) -> None:
        self.book.revoked_at = time.time()
        for user in self.group(0):
            self.control.call("POST", f"/users/{user}/revoke", {})
            self.book.revoked.append(user)
        for user in self.group(1):
            self.control.call("PUT", f"/users/{user}/sync", {"last_sync_age_days": 120})
            self.book.parked.append(user)

    def unpark(self) -> None:
        for user in self.book.parked[: len(self.book.parked) // 2]:
            self.control.call("PUT", f"/users/{user}/sync", {"last_sync_age_days": 1})
            self.book.unparked.append(user)

    def server_errors(self) -> None:
        """The next reads get 503, however long the fleet waits before them (its users
        may all have been read just before: their next turns come an interval later)."""
        self.control.call("POST", "/faults", {"kind": "503", "next": 2 * self.plan.touched})
        self.book.injected.append((time.time(), time.time() + self.plan.burst_s, "503"))

    def too_many_requests(self) -> None:
        """Other traffic spends what is left of the budget: a 429 burst to its window's end,
        and again in the next windows until the fleet has met one (a few windows at most):
        in one window of seconds the fleet may read nothing (its users read just before,
        or backed off by the 503s, whose reads take precedence over the budget)."""
        self.background(self._spend_until_refused)

    def _spend_until_refused(self) -> None:
        from lta_worker.simulator import DEMO_CLIENT_ID

        for _ in range(BURST_WINDOWS):
            started = time.time()
            budget = self.control.call("GET", f"/budget/{DEMO_CLIENT_ID}")
            if budget["remaining"]:
                spend = {"client": DEMO_CLIENT_ID, "count": budget["remaining"]}
                self.control.call("POST", "/budget/consume", spend)
            budget = self.control.call("GET", f"/budget/{DEMO_CLIENT_ID}")
            ends = float(budget["reset_at"])
            self.book.injected.append((started, ends + 1.0, "429"))
            time.sleep(max(0.0, ends - time.time()))
            if any(e["status"] == 429 for e in request_log(self.control.base_url)):
                return

    def drop_and_forget(self) -> None:
        def drop(user: str) -> None:
            proc = self.cli.run("users", "drop", "--user", user)
            self.book.dropped[user] = proc.returncode
            self._unreached(user, proc)

        def forget(user: str) -> None:
            proc = self.cli.run("users", "forget", "--user", user)
            self.book.forgotten[user] = (proc.returncode, time.time())
            self._unreached(user, proc)

        # One command after the other in each of two threads: a dozen Python processes
        # starting at once would starve the fleet of the two cores for half a minute.
        def drops() -> None:
            for user in self.group(2):
                drop(user)

        def forgets() -> None:
            for user in self.group(3):
                forget(user)

        self.background(drops)
        self.background(forgets)

    def _unreached(self, user: str, proc: subprocess.CompletedProcess[str]) -> None:
        """Note a command that could not reach the database (it changed nothing)."""
        if proc.returncode == EX_TEMPFAIL and "the database" in proc.stderr:
            self.book.not_started.add(user)

    def reenroll_and_change(self) -> None:
        for n, user in enumerate(self.group(4)):
            payload = {"id": f"soak-{n}", "changed": True, "at": time.time()}
            self.control.call("PUT", f"/users/{user}/payloads", {"latest-change": payload})
            self.book.changed[user] = time.time()
            self.book.payloads[user] = {"latest-change": payload}
        self.background(self._reenroll)

    def _reenroll(self) -> None:
        for user in self.book.revoked[: len(self.book.revoked) // 2]:
            started = self.cli.run("enroll", "url", "--user", user)
            if started.returncode != 0:  # the database cut: the user stays revoked
                self.book.reenrolled[user] = started.returncode
                continue
            url = started.stdout.strip()
            self.control.call("POST", "/consent", {"user": user})
            location = _redirect(url)
            self.book.reenrolled[user] = self.cli.run(
                "enroll", "finish", "--user", user, stdin=location + "\n"
            ).returncode

    def sighup(self) -> None:
        self.write_config(self.plan.new_interval_s)
        self.book.hupped = self.fleet.sighup()

    def skewed_instance(self) -> None:
        self.fleet.start(self.plan.instances, clock_offset_s=self.plan.lease_s / 4)

    def play(self, db_url: str) -> tuple[list[dict[str, Any]], float, float]:
        """Start the fleet, play the schedule, run on past the last fault and until the
        webhook outbox is empty (bounded); what was played, the start and the last fault
        (Unix seconds)."""
        for slot in range(self.plan.instances):
            self.fleet.start(slot)
        started, wall_start = time.monotonic(), time.time()
        played: list[dict[str, Any]] = []
        for at, name, action in self.schedule():
            self.wait_until(started + at)
            action()
            played.append({"at_s": round(time.monotonic() - started, 1), "fault": name})
            log(f"B6: {name} at {played[-1]['at_s']} s")
        last_fault = time.time()
        # Claims that lapsed in the stall stay held until their lease expires: the
        # fleet gets two leases and a few ticks after the last fault to read again.
        end = max(self.plan.seconds, time.monotonic() - started + 2 * self.plan.lease_s + 5)
        self.wait_until(started + end)
        self.join()
        # Deliveries that failed while the receiver was down back off (doubling from
        # 5 s): they are due again within about as long as it was down.
        deadline = time.monotonic() + self.plan.receiver_down_s + 30
        while outbox_left(db_url) and time.monotonic() < deadline:
            time.sleep(1.0)
        log(f"B6: done at {round(time.monotonic() - started, 1)} s")
        return played, wall_start, last_fault

    def wait_until(self, moment: float) -> None:
        """Sleep until `moment` (monotonic), restarting what systemd would meanwhile."""
        while (left := moment - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
            self.fleet.supervise()

    def schedule(self) -> list[tuple[float, str, Callable[[], Any]]]:
        """The faults: (seconds from the start, name, what to do)."""
        t, p = self.plan.seconds, self.plan
        return sorted(
            [
                (0.10 * t, "webhook receiver down", self.sink.down),
                (0.10 * t + p.receiver_down_s, "webhook receiver up", self.sink.up),
                (0.15 * t, "revocations and parked users", self.revoke_and_park),
                (0.20 * t, "the service answers 503 (the next reads)", self.server_errors),
                (0.20 * t + p.burst_s, "then 429 (budget spent)", self.too_many_requests),
                (0.25 * t, "sigkill instance 0", lambda: self.fleet.kill(0)),
                (0.25 * t + 3, "restart instance 0", lambda: self.fleet.start(0)),
                (0.30 * t, "users drop and users forget (CLI)", self.drop_and_forget),
                (0.35 * t, "re-enrollments (CLI), data changes", self.reenroll_and_change),
                (0.45 * t, "an instance with its clock stepped ahead", self.skewed_instance),
                (0.50 * t, "cut every database connection", self.proxy.cut),
                (0.50 * t + p.cut_s, "restore the database", self.proxy.restore),
                (0.55 * t, "parked users sync again", self.unpark),
                (
                    max(0.60 * t, 0.50 * t + p.cut_s + 5),
                    "SIGHUP with a shorter interval",
                    lambda: self.background(self.sighup),
                ),
                (0.70 * t, "stall the database", self.proxy.stall),
                (0.70 * t + p.stall_s, "resume the database", self.proxy.resume),
            ],
            key=lambda step: step[0],
        )


def _redirect(url: str) -> str:
    """Follow a consent URL at the simulator (consent queued): the redirect's Location."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=60) as answer:
            return str(answer.headers.get("location") or "")
    except urllib.error.HTTPError as redirect:
        return str(redirect.headers.get("location") or "")


# -- the checks, after the soak -------------------------------------------------------------


def _rows(db_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def _final_users(db_url: str) -> dict[str, dict[str, Any]]:
    rows = _rows(
        db_url,
        'SELECT id, "user", state, token_ciphertext IS NOT NULL AS has_token, next_due_at,'
        " consecutive_failures FROM users",
    )
    return {row["user"]: row for row in rows}


def _upstream_live(control: Control, user: str) -> bool:
    """Whether the simulator still holds a live grant of the worker's client for `user`."""
    from lta_worker.simulator import DEMO_CLIENT_ID

    info = control.call("GET", f"/users/{user}")
    return any(
        g["client"] == DEMO_CLIENT_ID and g["state"] == "active" for g in info["connected_services"]
    )


def check_lifecycle(
    book: Book,
    final: dict[str, dict[str, Any]],
    control: Control,
    db_url: str,
    reads: list[dict[str, Any]],
) -> dict[str, list[Any]]:
    """Revocations, re-enrollments, drops and forgets against the database and the service.

    A revoked user counts once a read of it reached the service after the revocation (the
    service said 401): one the fleet has not come back to yet is listed apart
    (`revoked_not_read_since`; the token is rightly kept until a read says otherwise)."""
    reenrolled = {u for u, code in book.reenrolled.items() if code == 0}
    revoked = set(book.revoked) - reenrolled
    read_since = {
        str(e["user"])
        for e in reads
        if e.get("user") in revoked and parse_at(e["at"]) > book.revoked_at
    }
    revoked_with_token = [
        {"user": u, **_brief(final.get(u))}
        for u in sorted(read_since)
        if final.get(u) is None or final[u]["has_token"]
    ]
    reenrolled_wrong = [
        {"user": u, **_brief(final.get(u))}
        for u in reenrolled
        if final.get(u) is None or final[u]["state"] != "active" or not final[u]["has_token"]
    ]
    drops_wrong = []
    for user, code in [*book.dropped.items(), *((u, c) for u, (c, _) in book.forgotten.items())]:
        row, live = final.get(user), _upstream_live(control, user)
        confirmed_ok = row is not None and row["state"] == "dropped" and not row["has_token"]
        confirmed_ok = confirmed_ok and not live
        pending_ok = row is not None and row["state"] == "dropping" and row["has_token"]
        # 75 before anything was written (the database cut at the command's start): the
        # user is as it was, token and grant kept; the command said so on stderr.
        untouched_ok = (
            user in book.not_started
            and row is not None
            and bool(row["has_token"])
            and live
            and row["state"] not in {"dropping", "dropped"}
        )
        told = (
            confirmed_ok
            if code == 0
            else (confirmed_ok or pending_ok or untouched_ok)
            if code == EX_TEMPFAIL
            else False
        )
        if not told:
            drops_wrong.append({"user": user, "code": code, "upstream_live": live, **_brief(row)})
    # A forget that purged (it returned 0, or left the user dropping or dropped); one cut
    # off before it wrote anything purged nothing.
    forgotten_ids = [
        final[u]["id"]
        for u, (code, _) in book.forgotten.items()
        if u in final and (code == 0 or final[u]["state"] in {"dropping", "dropped"})
    ]
    written = []
    for table in ("snapshots", "history"):
        for row in _rows(
            db_url,
            f"SELECT user_id, endpoint, fetched_at FROM {table}"  # noqa: S608 - two names
            " WHERE user_id = ANY(:ids)",
            ids=forgotten_ids,
        ):
            written.append({"table": table, **{k: str(v) for k, v in row.items()}})
    return {
        "revoked_with_token": revoked_with_token,
        "revoked_not_read_since": sorted(revoked - read_since),
        "reenrolled_not_active": reenrolled_wrong,
        "drops_not_as_told": drops_wrong,
        "forgotten_written_after": written,
    }


def _brief(row: dict[str, Any] | None) -> dict[str, Any]:
    if row is None:
        return {"state": None}
    return {"state": row["state"], "has_token": bool(row["has_token"])}


def webhook_order(
    touched: set[str],
    final: dict[str, dict[str, Any]],
    received: list[dict[str, Any]],
    clock_step_s: float = 0.0,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The distinct events received, the users whose last event received does not name their
    final state (missing), and the users' events received out of order.

    An event's timestamp is its writer's clock, and one instance runs with its clock stepped
    ahead by `clock_step_s`: two events of a user written close together by that instance and
    by another (or by a CLI command) can carry timestamps up to the step out of their real
    order. So the receipt order is the order judged: a timestamp may go back by at most the
    step (and `CLOCK_SLACK_S`), and the last event received for a user names its state."""
    first: dict[str, dict[str, Any]] = {}
    for event in received:
        first.setdefault(str(event["id"]), event)
    per_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in sorted(first.values(), key=lambda e: e["received"]):
        per_user[str(event["user"])].append(event)
    out_of_order = []
    for user, events in per_user.items():
        for a, b in pairwise(events):
            back = parse_at(a["timestamp"]) - parse_at(b["timestamp"])
            if back > clock_step_s + CLOCK_SLACK_S:
                out_of_order.append({"user": user, "first": a["type"], "then": b["type"]})
    missing = []
    for user in sorted(touched | set(per_user)):
        row = final.get(user)
        events = per_user.get(user, [])
        state = row["state"] if row else None
        last = events[-1]["new_state"] if events else "active"  # the bulk load sends none
        if state is not None and last != state:
            missing.append({"user": user, "state": state, "last_event": last})
    return first, missing, out_of_order


def check_webhooks(
    book: Book,
    final: dict[str, dict[str, Any]],
    received: list[dict[str, Any]],
    db_url: str,
    clock_step_s: float = 0.0,
) -> dict[str, Any]:
    """Every state change reached the receiver, in order per user (`webhook_order`), and
    nothing waits in the outbox."""
    touched = {*book.revoked, *book.parked, *book.dropped, *book.forgotten, *book.reenrolled}
    first, missing, out_of_order = webhook_order(touched, final, received, clock_step_s)
    waiting = _rows(
        db_url,
        "SELECT count(*) FILTER (WHERE dead_at IS NULL) AS waiting,"
        " count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead FROM webhook_outbox",
    )[0]
    return {
        "received": len(received),
        "distinct": len(first),
        "types": dict(sorted(_count(e["type"] for e in first.values()).items())),
        "missing": missing,
        "out_of_order": out_of_order,
        "waiting": int(waiting["waiting"]),
        "dead": int(waiting["dead"]),
    }


def outbox_left(db_url: str) -> int:
    """Webhook events not delivered yet (dead letters included)."""
    return int(_rows(db_url, "SELECT count(*) AS n FROM webhook_outbox")[0]["n"])


def check_data(
    book: Book,
    final: dict[str, dict[str, Any]],
    reads: list[dict[str, Any]],
    changes: dict[str, dict[str, Any]],
    db_url: str,
    *,
    started: float,
) -> dict[str, Any]:
    """Each (user, endpoint) read with 200 after its last change holds what was served, or
    its user is due again (a write lost to a fault is read again; the turn is not done)."""
    from lta_worker.simulator.state import default_payloads as defaults

    read_after: set[tuple[str, str]] = set()
    for entry in reads:
        if entry["status"] != 200 or not entry.get("user"):
            continue
        user = str(entry["user"])
        endpoint = entry["path"][len(READ_PATH) :].split("?")[0]
        if parse_at(entry["at"]) > book.changed.get(user, started):
            read_after.add((user, endpoint))
    ids = {row["id"]: user for user, row in final.items()}
    stored = {
        (ids[row["user_id"]], row["endpoint"]): row
        for row in _rows(db_url, "SELECT user_id, endpoint, status, payload FROM snapshots")
        if row["user_id"] in ids
    }
    gone = {*book.dropped, *book.forgotten, *book.revoked}
    now = datetime.now(UTC)
    differ, still_due = [], 0
    checked = 0
    for user, endpoint in sorted(read_after):
        if user in gone:
            continue
        expected = changes.get(user, {}).get(endpoint, defaults(user).get(endpoint))
        row = stored.get((user, endpoint))
        checked += 1
        if row is not None and row["payload"] == expected:
            continue
        due = final[user]["next_due_at"]
        if due is not None and _aware(due) <= now:
            # A read whose write was lost (the database cut or stalled, the instance
            # killed) leaves its user due: read again, not yet, when the soak ended.
            still_due += 1
            continue
        differ.append({"user": user, "endpoint": endpoint, "stored": row is not None})
    return {"checked": checked, "differ": differ, "unstored_still_due": still_due}


def check_reload(fleet: Fleet, final: dict[str, dict[str, Any]], plan: SoakPlan) -> dict[str, Any]:
    """Every instance SIGHUP reached reloaded, and the new interval is the one in force."""
    not_reloaded = []
    followed = 0
    for one in fleet.all:
        if one.hupped_at is None:
            continue
        reloaded = [e for e in one.events("service.reloaded") if e.get("ok")]
        if not reloaded:
            not_reloaded.append(one.log.name)
    for one in fleet.all:
        followed += sum(
            1
            for e in one.events("schedule.followed")
            if float(e.get("interval_s", 0)) == float(plan.new_interval_s)
        )
    now = datetime.now(UTC)
    horizon = timedelta(seconds=plan.new_interval_s + plan.lease_s)
    late = [
        {"user": user, "due_in_s": round((_aware(row["next_due_at"]) - now).total_seconds(), 1)}
        for user, row in final.items()
        if row["state"] == "active"
        and row["consecutive_failures"] == 0
        and row["next_due_at"] is not None
        and _aware(row["next_due_at"]) > now + horizon
    ]
    return {
        "not_reloaded": not_reloaded,
        "schedule_followed": followed,
        "due_late": late[:20],
        "due_late_count": len(late),
    }


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)


# -- the run ----------------------------------------------------------------------------------


def _store_tokens(
    settings: Any, control: Control, tokens: list[tuple[str, str]], plan: SoakPlan
) -> set[str]:
    """Store the users' tokens, each of the last `2 * touched` with its own trouble: the
    first half gets nothing recorded (latest-change 404), the second a token the service
    never issued (plain 401s), due half an interval later than the others, in passes of
    fewer users. Returns the users with a forgotten token."""
    n = plan.touched
    now = datetime.now(UTC)
    for user, _ in tokens[-2 * n : -n]:
        control.call("PUT", f"/users/{user}/payloads", {"latest-change": None})
    forgotten = [(user, "dspa_" + os.urandom(16).hex()) for user, _ in tokens[-n:]]
    bulk_store_tokens(settings, tokens[:-n], due_at=now - timedelta(minutes=1))
    alone = now + timedelta(seconds=plan.interval_s / 2)
    bulk_store_tokens(settings, forgotten, due_at=alone)
    return {user for user, _ in forgotten}


def soak(url: str, plan: SoakPlan) -> dict[str, Any]:
    """Run one soak; its invariants and counts."""
    import base64

    from sqlalchemy import make_url

    with (
        Workspace("b6") as ws,
        pg.throwaway_database(url, "b6") as db_url,
        SimProcess(ws.path, plan.users, budget=plan.budget, window=plan.window_s) as sim,
        WebhookSink() as sink,
    ):
        target = make_url(db_url)
        secret = ws.path / "webhook-secret"
        secret.write_text("whsec_" + base64.b64encode(os.urandom(32)).decode() + "\n")
        secret.chmod(0o600)
        with FaultProxy(
            (target.host or "127.0.0.1", target.port or 5432), limit_s=None, idle_s=None
        ) as proxy:
            proxied = target.set(host="127.0.0.1", port=proxy.port)

            def write_config(interval_s: int) -> Path:
                return ws.write_config(
                    sim.base_url,
                    sim.auth_url,
                    database={"url": proxied.render_as_string(hide_password=False)},
                    poll={
                        "concurrency": 8,
                        "batch_size": 50,
                        "tick": "1s",
                        "interval": f"{interval_s}s",
                        "parked_interval": f"{interval_s}s",
                        "lease_duration": f"{plan.lease_s}s",
                    },
                    serve={"heartbeat": "2s", "grace_period": "5s"},
                    # Between a window's end and the first answer of the next, the pacer
                    # knows no budget and paces at this rate: a quarter of the real one.
                    ratelimit={"fallback_per_hour": plan.budget * 3600 / plan.window_s / 4},
                    webhook={
                        "url": sink.url,
                        "secret_file": str(secret),
                        "interval": "1s",
                        "events": list(STATE_EVENTS),
                    },
                )

            settings = ws.settings(sim.base_url, sim.auth_url, database={"url": db_url})
            tokens = sim.tokens()
            control = Control(sim.base_url)
            forgotten = _store_tokens(settings, control, tokens, plan)
            _execute(db_url, LEASE_LOG_DDL)
            config = write_config(plan.interval_s)
            fleet = Fleet(ws, config)
            run = Soak(
                plan,
                fleet,
                proxy,
                sink,
                control,
                Cli(config),
                write_config,
                [user for user, _ in tokens],
            )
            collector = LogCollector(sim.base_url).start()
            try:
                played, wall_start, last_fault = run.play(db_url)
                exits = fleet.unexpected_exits()
            finally:
                codes = fleet.stop_all()
            entries = collector.finish()
            final = _final_users(db_url)
            user_ids = {user: row["id"] for user, row in final.items()}
            preempted: list[dict[str, Any]] = []
            leases = lease_log(db_url)
            # The holder's margin (`read_margin`): service.request_timeout (60 s here) or
            # a third of the lease, whichever is less.
            found = doubles(
                fleet,
                leases,
                user_ids,
                wall_start,
                margin_s=min(60.0, plan.lease_s / 3),
                preempted=preempted,
            )
            keep = os.environ.get(KEEP_ENV)
            if keep:
                _keep(Path(keep), ws.path, entries, sink.events(), leases)
            reads = [e for e in entries if e["path"].startswith(READ_PATH)]
            lifecycle = check_lifecycle(run.book, final, control, db_url, reads)
            webhooks = check_webhooks(
                run.book, final, sink.events(), db_url, clock_step_s=plan.lease_s / 4
            )
            data = check_data(run.book, final, reads, run.book.payloads, db_url, started=wall_start)
            reload = check_reload(fleet, final, plan)
            skewed = sum(
                1
                for one in fleet.all
                if one.clock_offset_s is not None
                for e in one.events("poll.read")
                if e.get("status") == 200
            )
            bad = [
                e
                for one in fleet.all
                for e in one.events()
                if e.get("level") in {"warning", "error", "critical"}
            ]
            warnings = _count(f"{e.get('level')} {e.get('event')}" for e in bad)
            samples = {f"{e.get('level')} {e.get('event')}": json.dumps(e)[:400] for e in bad}
    after = [e for e in reads if parse_at(e["at"]) > last_fault]
    injected_429 = [w for w in run.book.injected if w[2] == "429"]
    answers_429 = [parse_at(e["at"]) for e in entries if e["status"] == 429]
    earned = [at for at in answers_429 if not any(a <= at <= b for a, b, _ in injected_429)]
    invariants = {
        "doubles (two instances, one lease)": (len(found), "<= 0"),
        "429s earned by the fleet": (len(earned), "<= 0"),
        "revoked users still holding a token": (len(lifecycle["revoked_with_token"]), "<= 0"),
        "re-enrolled users not active": (len(lifecycle["reenrolled_not_active"]), "<= 0"),
        "drops not as their command said": (len(lifecycle["drops_not_as_told"]), "<= 0"),
        "rows of forgotten users written after forget": (
            len(lifecycle["forgotten_written_after"]),
            "<= 0",
        ),
        "webhooks missing (state changes)": (len(webhooks["missing"]), "<= 0"),
        "webhooks out of order per user": (len(webhooks["out_of_order"]), "<= 0"),
        "webhooks left in the outbox": (webhooks["waiting"] + webhooks["dead"], "<= 0"),
        "exits (on a survivable fault)": (len(exits), "<= 0"),
        "users whose token the service forgot, rejected": (
            sum(1 for u in forgotten if final.get(u, {}).get("state") == "rejected"),
            ">= 1",
        ),
        "stored results unlike what was served": (len(data["differ"]), "<= 0"),
        "instances not reloaded on SIGHUP": (len(reload["not_reloaded"]), "<= 0"),
        "users due later than the new interval": (reload["due_late_count"], "<= 0"),
        "reads after the last fault": (len(after), ">= 1"),
        "reads by the instance with a stepped clock": (skewed, ">= 1"),
        "results checked against the simulator": (data["checked"], ">= 1"),
        "webhooks received": (webhooks["distinct"], ">= 1"),
        "429s injected (other traffic)": (len(answers_429) - len(earned), ">= 1"),
        "503s injected": (sum(1 for e in reads if e["status"] == 503), ">= 1"),
    }
    return {
        "plan": plan.__dict__,
        "faults": played,
        "invariants": {
            name: {"value": value, "target": target, "held": _holds(value, target)}
            for name, (value, target) in invariants.items()
        },
        "reads": len(reads),
        "statuses": dict(sorted(_count(str(e["status"]) for e in reads).items())),
        "doubles": found[:50],
        "preempted_reads": preempted[:20],
        "unexpected_exits": exits,
        "stop_codes": codes,
        "incarnations": len(fleet.all),
        "lifecycle": {k: v[:20] for k, v in lifecycle.items()},
        "commands": _count(f"{' '.join(r['args'][:2])} -> {r['code']}" for r in run.cli.runs),
        "webhooks": {
            **webhooks,
            "missing": webhooks["missing"][:20],
            "out_of_order": webhooks["out_of_order"][:20],
        },
        "data": {**data, "differ": data["differ"][:20]},
        "reload": reload,
        "warnings_and_errors": dict(sorted(warnings.items())),
        "warning_and_error_samples": samples,
    }


def _keep(
    to: Path,
    workspace: Path,
    entries: list[dict[str, Any]],
    received: list[dict[str, Any]],
    leases: list[dict[str, Any]],
) -> None:
    import shutil

    to.mkdir(parents=True, exist_ok=True)
    for path in workspace.glob("serve-*.log"):
        shutil.copy(path, to / path.name)
    (to / "requests.json").write_text(json.dumps(entries))
    (to / "webhooks.json").write_text(json.dumps(received))
    (to / "lease_log.json").write_text(json.dumps(leases, default=str))


def _holds(value: float, target: str) -> bool:
    op, bound = target.split()
    return value <= float(bound) if op == "<=" else value >= float(bound)


def _count(values: Iterable[Any]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return dict(counts)


def run(size: Size) -> BenchResult:
    """Run the soak (skipped, saying why, without a PostgreSQL server)."""
    result = BenchResult("B6", "soak: serve instances on PostgreSQL under faults")
    url = pg.server_url()
    if url is None:
        result.add("skipped", "no server", note=pg.SKIP_REASON)
        result.details["skipped"] = pg.SKIP_REASON
        return result
    plan = PLANS[size]
    out = soak(url, plan)
    result.details.update(out)
    note = f"{plan.instances} instances, {plan.users:,} users, {plan.seconds:.0f} s"
    for name, figure in out["invariants"].items():
        op, bound = figure["target"].split()
        if op == "<=":
            result.add(name, figure["value"], at_most=float(bound), note=note)
        else:
            result.add(name, figure["value"], at_least=float(bound), note=note)
    return result
