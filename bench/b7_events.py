"""B7: `result.changed` events: how soon a stored change reaches the receiver, and what the
outbox costs the pass's writes.

1. Delay under `serve`: users enrolled in the simulator (a child process, `SimProcess`),
   `lta-worker serve` (a child process) with `[webhook]` pointed at a receiver on loopback
   in this process. The receiver notes when each
   `result.changed` arrives; the delay is that moment less the event's `read_at` (the read
   that found the change, a few milliseconds before its commit; one machine, one clock).
   Two phases: the burst (serve's first pass stores every user's first two results, each a
   change, all at once: the delivery drains a queue) and the steady state (then one user's
   content changes every `TRICKLE_EVERY_S` for `TRICKLE_S`, and the bench makes that user
   due, so that it is read at serve's next tick: reads come at any moment, not in passes
   over every user; each change waits for the next delivery round alone). Median and p95
   of each, at the default `webhook.interval` (5 s) and at 500 ms.
2. The outbox on `apply`: the same batches of turns (100 users, both endpoints, every
   content new, the worst case) written by `Store.apply` into two SQLite databases, one
   with `result_events = "hash"` and one with "off", alternating; the ratio of the median
   times. The outbox is emptied between rounds (untimed), as the delivery would.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    ROOT,
    BenchResult,
    SimProcess,
    Size,
    Workspace,
    bulk_store_tokens,
    log,
    median,
    store_tokens,
)
from lta_worker.domain import parse_duration

POLL = {"interval": "1h", "tick": "250ms"}  # a user is read again when the bench says
TRICKLE_S = 20.0
TRICKLE_EVERY_S = 0.25
SECRET = "whsec_" + base64.b64encode(b"b7-bench-webhook-secret-32bytes!").decode()
BATCH = 100  # `poll.batch_size`'s default: the turns one `apply` writes
WAIT_S = 300.0


class Receiver:
    """A loopback receiver: notes when each event arrives (wall clock), answers 204."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived: list[tuple[float, dict[str, Any]]] = []

    def changes(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return [(t, e) for t, e in self.arrived if e["type"] == "result.changed"]

    @contextmanager
    def serving(self) -> Iterator[int]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                at = time.time()
                with receiver.lock:
                    receiver.arrived.append((at, json.loads(body)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            server.server_close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _figures(delays: list[float]) -> dict[str, Any]:
    return {
        "events": len(delays),
        "median_s": round(median(delays), 3) if delays else None,
        "p95_s": round(_quantile(delays, 0.95), 3) if delays else None,
        "max_s": round(max(delays), 3) if delays else None,
    }


def _trickle(control_url: str, db_path: Path, users: list[str], seconds: float) -> int:
    """Change one user's latest-change every `TRICKLE_EVERY_S` for `seconds`, each made due
    at once (serve reads it at its next tick); how many."""
    import sqlite3

    import httpx

    changed = 0
    con = sqlite3.connect(db_path, timeout=30)
    try:
        with httpx.Client(base_url=control_url, timeout=10) as control:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                user = users[changed % len(users)]
                body = {"latest-change": {"k": changed}}
                control.put(f"/users/{user}/payloads", json=body).raise_for_status()
                due = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=1)
                with con:
                    con.execute(
                        "UPDATE users SET next_due_at = ? WHERE user = ?",
                        (due.isoformat(sep=" ", timespec="microseconds"), user),
                    )
                changed += 1
                time.sleep(TRICKLE_EVERY_S)
    finally:
        con.close()
    return changed


def serve_delays(users: int, interval: str, trickle_s: float) -> dict[str, Any]:
    """One serve run: the delay (seconds) of the first pass's events, then of single
    changes, each median and p95."""
    receiver = Receiver()
    with Workspace("b7-serve") as ws, SimProcess(ws.path, users) as sim, receiver.serving() as port:
        secret = ws.path / "webhook-secret"
        secret.write_text(SECRET + "\n")
        os.chmod(secret, 0o600)
        hook = {"url": f"http://127.0.0.1:{port}/hook", "secret_file": str(secret)}
        hook["interval"] = interval
        poll = POLL
        settings = ws.settings(sim.base_url, sim.auth_url, webhook=hook, poll=poll)
        tokens = sim.tokens()
        store_tokens(settings, tokens)
        config = ws.write_config(sim.base_url, sim.auth_url, webhook=hook, poll=poll)
        expected = 2 * users
        proc = subprocess.Popen(
            [PYTHON, "-m", "lta_worker", "--config", str(config), "serve"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")},
        )
        try:
            deadline = time.monotonic() + WAIT_S
            while len(receiver.changes()) < expected and time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited with {proc.returncode}")
                time.sleep(0.05)
            burst = receiver.changes()
            changed = _trickle(
                sim.base_url + "/_sim", ws.db_path, [u for u, _ in tokens], trickle_s
            )
            # Every change is read within a tick, then waits at most a delivery round.
            time.sleep(
                parse_duration(POLL["tick"]).total_seconds()
                + 3 * parse_duration(interval).total_seconds()
                + 1
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    if len(burst) < expected:
        raise RuntimeError(f"{len(burst)} of {expected} events arrived in {WAIT_S:.0f} s")
    later = receiver.changes()[len(burst) :]

    def delays(events: list[tuple[float, dict[str, Any]]]) -> list[float]:
        return [at - datetime.fromisoformat(e["data"]["read_at"]).timestamp() for at, e in events]

    return {
        "users": users,
        "webhook_interval": interval,
        "burst": _figures(delays(burst)),
        "steady": {"changes_made": changed, **_figures(delays(later))},
    }


def apply_overhead(users: int, rounds: int) -> dict[str, Any]:
    """Median seconds per `apply` of a batch, with result.changed events and without."""
    from lta_worker.domain import ResultEvents, SnapshotWrite, UserUpdate
    from lta_worker.storage import OutboxEvent, Store

    times: dict[ResultEvents, list[float]] = {"hash": [], "off": []}
    with Workspace("b7-on") as on, Workspace("b7-off") as off:
        stores: dict[ResultEvents, Store] = {}
        modes: tuple[tuple[ResultEvents, Workspace], ...] = (("hash", on), ("off", off))
        for mode, ws in modes:
            base = "http://127.0.0.1:9"
            settings = ws.settings(base, base + "/auth")
            bulk_store_tokens(settings, ((f"u{i:06d}", f"dspa_{i:032d}") for i in range(users)))
            store = Store.open(settings.database.url)
            store.result_events = mode
            stores[mode] = store
        ids = {mode: [r.id for r in store.list_users()] for mode, store in stores.items()}
        start = datetime.now(UTC)
        try:
            for r in range(rounds):
                at = start + timedelta(minutes=r + 1)
                order: tuple[ResultEvents, ...] = ("off", "hash") if r % 2 else ("hash", "off")
                for mode in order:
                    store = stores[mode]
                    for i in range(0, users, BATCH):
                        batch = [
                            UserUpdate(
                                user_id=uid,
                                state="active",
                                next_due_at=at + timedelta(hours=1),
                                consecutive_failures=0,
                                last_outcome="ok",
                                last_polled_at=at,
                                snapshots=tuple(
                                    SnapshotWrite(e, "ok", {"round": r, "user": uid, "e": e}, at)
                                    for e in ("latest-change", "stats")
                                ),
                            )
                            for uid in ids[mode][i : i + BATCH]
                        ]
                        t0 = time.perf_counter()
                        store.apply(batch)
                        times[mode].append(time.perf_counter() - t0)
                    with store.database.write() as conn:  # the delivery's part, untimed
                        conn.execute(OutboxEvent.__table__.delete())
        finally:
            for store in stores.values():
                store.close()
    on_s, off_s = statistics.median(times["hash"]), statistics.median(times["off"])
    return {
        "users": users,
        "rounds": rounds,
        "batch": BATCH,
        "apply_ms_with_events": round(1000 * on_s, 2),
        "apply_ms_without": round(1000 * off_s, 2),
        "ratio": round(on_s / off_s, 3),
        "us_per_event": round(1e6 * (on_s - off_s) / (2 * BATCH), 1),
    }


def run(size: Size) -> BenchResult:
    """Run B7 and return its figures."""
    users = {"full": 200, "quick": 100, "smoke": 10}[size]
    apply_users = {"full": 2000, "quick": 1000, "smoke": 200}[size]
    rounds = {"full": 7, "quick": 5, "smoke": 2}[size]
    result = BenchResult("B7", "result.changed: delay to the receiver, outbox cost on apply")
    trickle = TRICKLE_S if size != "smoke" else 2.0
    runs = [serve_delays(users, "5s", trickle)] if size != "smoke" else []
    runs.append(serve_delays(users, "500ms", trickle))
    for one in runs:
        log(f"B7 serve at webhook.interval {one['webhook_interval']}: {one}")
    cost = apply_overhead(apply_users, rounds)
    log(f"B7 apply: {cost}")
    result.details = {"serve": runs, "apply": cost}
    for one in runs:
        at, burst, steady = one["webhook_interval"], one["burst"], one["steady"]
        note = f"{steady['events']} single changes among {one['users']} users"
        for name, key in (("median", "median_s"), ("p95", "p95_s")):
            result.add(
                f"delay to the receiver, {name} (interval {at})", steady[key], "s", note=note
            )
        note = f"{burst['events']} first results of {one['users']} users in one pass"
        for name, key in (("median", "median_s"), ("p95", "p95_s")):
            result.add(
                f"first pass burst: delay, {name} (interval {at})", burst[key], "s", note=note
            )
    result.add(
        "apply with events / without",
        cost["ratio"],
        "x",
        note=f"batches of {BATCH}, every content new; {cost['us_per_event']} us per event",
    )
    return result
