"""B3 memory: peak RSS of one pass over many due users, at two sizes, in a child process.

The parent starts the simulator in its own process (budget 10**9 per hour), enrolls the
users there through the real consent flow, stores their tokens (encrypted by the vault, in
one bulk transaction), writes a config file, and runs `python -m bench.b3_memory CONFIG`:
a fresh process that opens a `Worker` from that config (logs rendered as JSON into
/dev/null), runs one pass and prints its peak RSS (VmHWM) with RSS samples taken
every second, so growth during the pass shows too.

The users consent to latest-change only (one read each): memory depends on users, not on
reads per user, and this halves the time of the 100,000-user pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    ROOT,
    SimProcess,
    Size,
    Workspace,
    bulk_store_tokens,
    cpu_seconds,
    current_rss_mb,
    log,
    peak_rss_mb,
)
from lta_worker.protocol import LATEST_CHANGE_SCOPE

SCOPE = (LATEST_CHANGE_SCOPE,)
CHILD_TIMEOUT_S = 1200.0


def measure(size: Size) -> dict[str, Any]:
    """Peak RSS of a pass at a small and a large size (5,000 and 100,000; quick 2,000/10,000)."""
    sizes = {"full": (5_000, 100_000), "quick": (2_000, 10_000), "smoke": (100, 200)}[size]
    return {"scopes": list(SCOPE), "sizes": [_one(users) for users in sizes]}


def _one(users: int) -> dict[str, Any]:
    with Workspace("b3-memory") as ws:
        t0 = time.perf_counter()
        with SimProcess(ws.path, users, scopes=SCOPE) as sim:
            settings = ws.settings(sim.base_url, sim.auth_url)
            bulk_store_tokens(settings, sim.tokens(), scopes=SCOPE)
            config = ws.write_config(sim.base_url, sim.auth_url)
            log(f"B3 memory: {users:,} users ready in {time.perf_counter() - t0:.0f} s; pass...")
            proc = subprocess.run(
                [PYTHON, "-m", "bench.b3_memory", str(config)],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
                check=False,
            )
    if proc.returncode != 0:
        raise RuntimeError(f"memory pass failed ({proc.returncode}): {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["users"] = users
    log(
        f"B3 memory: {users:,} users: {out['reads']:,} reads in {out['wall_s']:.0f} s, "
        f"peak RSS {out['peak_rss_mb']:.1f} MB"
    )
    return out


class Sampler:
    """RSS every `period` seconds on a daemon thread (at most `limit` samples kept)."""

    def __init__(self, period: float = 1.0, limit: int = 4000) -> None:
        self.samples: list[tuple[float, float]] = []
        self._period, self._limit = period, limit
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._period) and len(self.samples) < self._limit:
            self.samples.append((time.monotonic() - self._start, current_rss_mb()))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def child(config: Path) -> dict[str, Any]:
    """One pass from `config` in this process; its RSS figures."""
    import anyio

    from bench.common import quiet_logs
    from lta_worker.config import load_settings
    from lta_worker.worker import Worker

    settings = load_settings(config, {})

    async def main() -> dict[str, Any]:
        async with Worker(settings, kind="run") as worker:
            before = current_rss_mb()
            with Sampler() as sampler:
                cpu0, t0 = cpu_seconds(), time.perf_counter()
                result = await worker.run_pass()
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        step = max(1, len(sampler.samples) // 40)
        return {
            "reads": result.reads,
            "stopped": result.stopped,
            "outcomes": dict(result.counts),
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "rss_before_pass_mb": round(before, 1),
            "rss_samples": [[round(t, 1), round(m, 1)] for t, m in sampler.samples[::step]],
        }

    with quiet_logs("info"):
        out = anyio.run(main)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


if __name__ == "__main__":
    print(json.dumps(child(Path(sys.argv[1]))))
