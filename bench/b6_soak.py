"""B6 soak (skeleton): N `serve` instances on one PostgreSQL database under faults.

N `lta-worker serve` processes, each with its own log file, on one PostgreSQL database of
their own (created on the server of `LTA_BENCH_DATABASE_URL`, dropped after), reached
through `faultproxy.FaultProxy`, against the simulator in its own process (`simproc`) with
U users and a finite budget. While they run for the set time, a fault schedule plays:

1. at a quarter: one instance is killed with SIGKILL (mid-pass: it reads continuously at
   this size) and restarted a few seconds later, as a new incarnation with its own log;
2. at a half: every database connection is cut (the proxy closes them and refuses new
   ones) for `cut_s`, then restored; the server itself is never touched;
3. at 70 %: the proxy stalls every byte for `stall_s`, then lets them through.

Then every instance gets SIGTERM, and the invariants are counted, each a figure:

- doubles: a (user, endpoint) answered 200 to two different incarnations less than half
  a lease apart (`poll.read` lines of their logs). A take-over after a SIGKILL comes
  at least a lease less one renewal after the dead instance's last read, so it is not
  counted; the interval is several leases, so a user's next turn is not either.
- 429s: answers 429 in the simulator's request log. Nothing else spends the client's
  budget here, so every one is the fleet's.
- exits: instances that exited by themselves (not killed, not yet stopped by the harness).
- reads after the last fault (the fleet resumed), and the total reads.

Not built yet (issue 28): SIGHUP, 5xx/429 bursts, revocations, `users drop`/`forget`
during passes, a webhook receiver that is down, a clock step, and the data check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench import pg
from bench.common import PYTHON, BenchResult, SimProcess, Size, Workspace, bulk_store_tokens, log
from bench.faultproxy import FaultProxy

READ_PATH = "/api/v1/history/"
# The simulator keeps its last 10,000 requests (`simulator.state.LOG_LIMIT`); the fleet
# makes far fewer than that in this many seconds at any budget of the plans.
COLLECT_S = 5.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SoakPlan:
    """The soak's size and its faults' lengths."""

    instances: int
    users: int
    seconds: float
    cut_s: float
    stall_s: float
    lease_s: int
    interval_s: int
    budget: int
    window_s: int


PLANS: dict[Size, SoakPlan] = {
    "full": SoakPlan(4, 20_000, 600, 40, 20, 15, 300, 20_000, 60),
    "quick": SoakPlan(4, 2_000, 180, 20, 15, 10, 60, 3_000, 30),
    "smoke": SoakPlan(2, 200, 40, 4, 8, 6, 24, 400, 10),
}


@dataclass
class Incarnation:
    """One `serve` process: its slot, its log, and how it ended."""

    slot: int
    process: subprocess.Popen[bytes]
    log: Path
    killed: bool = False
    stopped: bool = False

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

    def start(self, slot: int) -> Incarnation:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
        env.pop("CREDENTIALS_DIRECTORY", None)
        path = self.ws.path / f"serve-{slot}-{len(self.all)}.log"
        with path.open("wb") as sink:
            proc = subprocess.Popen(
                [PYTHON, "-m", "lta_worker", "--config", str(self.config), "serve"],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        one = Incarnation(slot, proc, path)
        self.all.append(one)
        return one

    def live(self, slot: int) -> Incarnation:
        return next(i for i in reversed(self.all) if i.slot == slot)

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

    def unexpected_exits(self) -> list[dict[str, Any]]:
        """Instances that ended by themselves during the soak."""
        return [
            {"slot": i.slot, "log": i.log.name, "code": i.process.returncode}
            for i in self.all
            if not i.killed and not i.stopped and i.process.poll() is not None
        ]


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def doubles(fleet: Fleet, lease_s: float, started: float) -> list[dict[str, Any]]:
    """Pairs of 200 reads of one (user, endpoint) by two incarnations < half a lease apart
    (`at_s`: the second read, in seconds from `started`, a wall-clock time)."""
    reads: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for one in fleet.all:
        for event in one.events("poll.read"):
            if event.get("status") == 200:
                reads[(event["user"], event["endpoint"])].append((_ts(event), one.log.name))
    found = []
    for (user, endpoint), seen in reads.items():
        seen.sort()
        for (t1, who1), (t2, who2) in pairwise(seen):
            if who1 != who2 and t2 - t1 < lease_s / 2:
                found.append({"user": user, "endpoint": endpoint, "gap_s": round(t2 - t1, 3)})
                found[-1].update(instances=[who1, who2], at_s=round(t2 - started, 1))
    return found


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


def _schedule(plan: SoakPlan, fleet: Fleet, proxy: FaultProxy) -> list[tuple[float, str, Any]]:
    """The faults: (seconds from the start, name, what to do)."""
    restart_after = 3.0
    t = plan.seconds
    steps: list[tuple[float, str, Callable[[], Any]]] = [
        (0.25 * t, "sigkill instance 0", lambda: fleet.kill(0)),
        (0.25 * t + restart_after, "restart instance 0", lambda: fleet.start(0)),
        (0.5 * t, "cut every database connection", proxy.cut),
        (0.5 * t + plan.cut_s, "restore the database", proxy.restore),
        (0.7 * t, "stall the database", proxy.stall),
        (0.7 * t + plan.stall_s, "resume the database", proxy.resume),
    ]
    return steps


def soak(url: str, plan: SoakPlan) -> dict[str, Any]:
    """Run one soak; its invariants and counts."""
    from sqlalchemy import make_url

    with (
        Workspace("b6") as ws,
        pg.throwaway_database(url, "b6") as db_url,
        SimProcess(ws.path, plan.users, budget=plan.budget, window=plan.window_s) as sim,
    ):
        target = make_url(db_url)
        with FaultProxy((target.host or "127.0.0.1", target.port or 5432)) as proxy:
            proxied = target.set(host="127.0.0.1", port=proxy.port)
            data: dict[str, dict[str, Any]] = {
                "database": {"url": proxied.render_as_string(hide_password=False)},
                "poll": {
                    "concurrency": 8,
                    "batch_size": 50,
                    "tick": "1s",
                    "interval": f"{plan.interval_s}s",
                    "lease_duration": f"{plan.lease_s}s",
                },
                "serve": {"heartbeat": "2s", "grace_period": "5s"},
            }
            settings = ws.settings(sim.base_url, sim.auth_url, database={"url": db_url})
            due = datetime.now(UTC) - timedelta(minutes=1)
            bulk_store_tokens(settings, sim.tokens(), due_at=due)
            config = ws.write_config(sim.base_url, sim.auth_url, **data)
            fleet = Fleet(ws, config)
            collector = LogCollector(sim.base_url).start()
            for slot in range(plan.instances):
                fleet.start(slot)
            started, wall_start = time.monotonic(), time.time()
            played: list[dict[str, Any]] = []
            for at, name, action in _schedule(plan, fleet, proxy):
                time.sleep(max(0.0, at - (time.monotonic() - started)))
                action()
                played.append({"at_s": round(time.monotonic() - started, 1), "fault": name})
                log(f"B6: {name} at {played[-1]['at_s']} s")
            last_fault = datetime.now(UTC).timestamp()
            # Claims that lapsed in the stall stay held until their lease expires: the
            # fleet gets two leases and a few ticks after the last fault to read again.
            end = max(plan.seconds, time.monotonic() - started + 2 * plan.lease_s + 5)
            time.sleep(max(0.0, end - (time.monotonic() - started)))
            exits = fleet.unexpected_exits()
            codes = fleet.stop_all()
            entries = collector.finish()
            found = doubles(fleet, plan.lease_s, wall_start)
            bad = [
                e
                for one in fleet.all
                for e in one.events()
                if e.get("level") in {"warning", "error", "critical"}
            ]
            warnings = _count(f"{e.get('level')} {e.get('event')}" for e in bad)
            samples = {f"{e.get('level')} {e.get('event')}": json.dumps(e)[:400] for e in bad}
    reads = [e for e in entries if e["path"].startswith(READ_PATH)]
    after = [e for e in reads if datetime.fromisoformat(e["at"]).timestamp() > last_fault]
    return {
        "plan": plan.__dict__,
        "faults": played,
        "reads": len(reads),
        "reads_after_last_fault": len(after),
        "statuses": dict(sorted(_count(str(e["status"]) for e in reads).items())),
        "answers_429": sum(1 for e in entries if e["status"] == 429),
        "doubles": found[:50],
        "doubles_count": len(found),
        "unexpected_exits": exits,
        "stop_codes": codes,
        "incarnations": len(fleet.all),
        "warnings_and_errors": dict(sorted(warnings.items())),
        "warning_and_error_samples": samples,
    }


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return dict(counts)


def run(size: Size) -> BenchResult:
    """Run the soak (skipped, saying why, without a PostgreSQL server)."""
    result = BenchResult("B6", "soak: serve instances on PostgreSQL under faults (skeleton)")
    url = pg.server_url()
    if url is None:
        result.add("skipped", "no server", note=pg.SKIP_REASON)
        result.details["skipped"] = pg.SKIP_REASON
        return result
    plan = PLANS[size]
    out = soak(url, plan)
    result.details.update(out)
    note = f"{plan.instances} instances, {plan.users:,} users, {plan.seconds:.0f} s"
    result.add("doubles (two instances, one lease)", out["doubles_count"], at_most=0, note=note)
    result.add("429s (the fleet's)", out["answers_429"], at_most=0, note=f"budget {plan.budget}")
    result.add(
        "exits (on a survivable fault)",
        len(out["unexpected_exits"]),
        at_most=0,
        note=f"SIGTERM exit codes at the end {out['stop_codes']}",
    )
    result.add(
        "reads after the last fault",
        out["reads_after_last_fault"],
        at_least=1,
        note=f"of {out['reads']:,} reads; statuses {out['statuses']}",
    )
    return result
