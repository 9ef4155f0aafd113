"""B3 on PostgreSQL, the fleet: reads per second of 1, 2 and 4 instances at an unlimited budget.

One simulator process (`bench.simproc`, on loopback, a budget of 10**9) with U enrolled
users whose tokens are stored in a PostgreSQL database of its own; then, for each N of 1, 2
and 4, every user is made due (no lease) and N `lta-worker run` processes start at once,
each one pass. The fleet's rate is the reads of all N (from their `pass.finished` lines)
over the time from the first `pass.started` to the last `pass.finished` (process start-up
is left out: it is B4's). The scaling ratio is the fleet's rate over one instance's.

On this machine the simulator, PostgreSQL and the N workers share two cores, so the ratio
says how much of the work is the worker's own (it would scale) and how much the shared
parts' (it does not); see the note of each figure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import pg
from bench.common import PYTHON, BenchResult, SimProcess, Size, Workspace, bulk_store_tokens, log

FLEETS = (1, 2, 4)
RUN_TIMEOUT_S = 600.0


def _make_all_due(url: str) -> None:
    due = datetime.now(UTC) - timedelta(minutes=1)
    with pg.connect(url, autocommit=False) as con:
        con.execute("DELETE FROM user_leases")
        con.execute("UPDATE users SET next_due_at = %s WHERE token_ciphertext IS NOT NULL", (due,))
        con.execute("DELETE FROM passes")
        con.commit()
        con.autocommit = True
        con.execute("VACUUM ANALYZE users")


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found.append(event)
    return found


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def fleet_pass(ws: Workspace, config: Path, n: int) -> dict[str, Any]:
    """N `lta-worker run` processes at once over every user; their reads and wall time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTA_WORKER_")}
    env.pop("CREDENTIALS_DIRECTORY", None)
    # An instance that finds nobody left to read ends an empty pass, logged at debug only.
    env["LTA_WORKER_LOG_LEVEL"] = "debug"
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for i in range(n):
            err = ws.path / f"fleet{n}-{i}.err"
            with err.open("wb") as sink:
                proc = subprocess.Popen(
                    [PYTHON, "-m", "lta_worker", "--config", str(config), "run"],
                    stdout=subprocess.DEVNULL,
                    stderr=sink,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            procs.append((proc, err))
        codes = [proc.wait(timeout=RUN_TIMEOUT_S) for proc, _ in procs]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
    started = [e for _, err in procs for e in _events(err, "pass.started")]
    finished = [e for _, err in procs for e in _events(err, "pass.finished")]
    if codes != [0] * n or len(finished) != n:
        tails = [err.read_text(errors="replace")[-600:] for _, err in procs]
        raise RuntimeError(f"fleet of {n}: exit codes {codes}; {tails}")
    wall = max(map(_ts, finished)) - min(map(_ts, started))
    reads = sum(int(e["reads"]) for e in finished)
    return {
        "instances": n,
        "reads": reads,
        "wall_s": round(wall, 3),
        "reads_per_s": reads / wall,
        "reads_each": [int(e["reads"]) for e in finished],
        "throttled": sum(int(e["throttled"]) for e in finished),
        "pass_wall_s": [e["wall_s"] for e in finished],
    }


def measure(url: str, size: Size) -> dict[str, Any]:
    """The fleet's reads/s with 1, 2 and 4 instances (details for results.json)."""
    users = {"full": 3000, "quick": 1500, "smoke": 100}[size]
    load = [round(x, 2) for x in os.getloadavg()]
    out: dict[str, Any] = {"users": users, "load_average_before": load, "fleets": []}
    with (
        Workspace("b3fleet") as ws,
        pg.throwaway_database(url, "b3fleet") as db_url,
        SimProcess(ws.path, users) as sim,
    ):
        data: dict[str, dict[str, Any]] = {"database": {"url": db_url}, "poll": {"concurrency": 8}}
        settings = ws.settings(sim.base_url, sim.auth_url, **data)
        config = ws.write_config(sim.base_url, sim.auth_url, **data)
        bulk_store_tokens(settings, sim.tokens())
        for n in FLEETS:
            _make_all_due(db_url)
            t0 = time.perf_counter()
            got = fleet_pass(ws, config, n)
            got["process_wall_s"] = round(time.perf_counter() - t0, 2)
            got["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            log(f"B3PG fleet of {n}: {got['reads']} reads, {got['reads_per_s']:.0f} reads/s")
            out["fleets"].append(got)
    return out


def add_figures(result: BenchResult, fleet: dict[str, Any]) -> None:
    """The reads/s of each fleet and its ratio to one instance's."""
    one = fleet["fleets"][0]["reads_per_s"]
    for got in fleet["fleets"]:
        n = got["instances"]
        note = f"{got['reads']:,} reads in {got['wall_s']:.1f} s; per instance {got['reads_each']}"
        result.add(f"fleet of {n}, reads/s (unlimited budget)", got["reads_per_s"], "reads/s")
        if n > 1:
            result.add(
                f"fleet of {n}, scaling ratio to one instance",
                got["reads_per_s"] / one,
                "x",
                note=f"{note}; load average after {got['load_average_after'][0]}",
            )
