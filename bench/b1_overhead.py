"""B1 overhead: a worker pass against a plain-httpx client making the same reads.

Both sides read `latest-change` then `stats` for every user, `poll.concurrency` (8) users
at a time, over one pooled `httpx.AsyncClient` with the same limits, against the simulator
on loopback with a budget too large to matter (10**9 per hour). The worker also decrypts
each token, paces, classifies, decides, logs (JSON, rendered into /dev/null, as in
production) and stores the results; the baseline only reads the bodies. The headline is
baseline_time / worker_time: the share of the worker's wall time that the reads alone need.

A third client sits in between: the worker's own `ApiClient.read` (streamed, size-capped
reads, secret registration, the insecure-URL hook) with nothing else, which splits the gap
into "HTTP layer" and "engine". After an untimed warm-up pass (a user's first results are
inserts; the steady state updates), rounds alternate worker, ApiClient and baseline; the
figures are medians.

The simulator runs in a child process (the headline: the worker does not share a GIL with
the server, as in production) and, for comparison, on a thread of the bench process. The
per-step costs of a turn come from `b1_breakdown`. One more round runs with a stand-in
`sniffio` module in `sys.modules`, to show what httpcore's repeated failed import costs.
"""

from __future__ import annotations

import sys
import time
import types
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx

from bench import b1_breakdown
from bench.common import (
    BenchResult,
    SimProcess,
    Size,
    Workspace,
    cpu_seconds,
    log,
    make_all_due,
    median,
    quiet_logs,
    store_tokens,
)
from lta_worker.protocol import READ_PATHS

CONCURRENCY = 8
BUDGET = 10**9
PATHS = tuple(READ_PATHS.values())


@dataclass
class Timing:
    """One measured pass (worker, ApiClient or baseline)."""

    wall_s: float
    cpu_s: float
    reads: int
    statuses: dict[str, int]
    extra: dict[str, Any]

    @property
    def reads_per_s(self) -> float:
        """Reads per second of wall time."""
        return self.reads / self.wall_s

    def row(self) -> dict[str, Any]:
        """As results.json shows it."""
        return {
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "reads": self.reads,
            "statuses": self.statuses,
            **self.extra,
        }


async def worker_pass(settings: Any, _tokens: Sequence[tuple[str, str]]) -> Timing:
    """One real pass (`Worker.run_pass`), timed from its start to its bookkeeping's end."""
    from lta_worker.worker import Worker

    async with Worker(settings, kind="run") as worker:
        waits: list[float] = []
        acquire = worker.pacer.acquire

        async def timed_acquire() -> Any:
            begun = time.perf_counter()
            permit = await acquire()
            waits.append(time.perf_counter() - begun)
            return permit

        worker.pacer.acquire = timed_acquire  # type: ignore[method-assign]
        # What the pacer itself decided: how many permits it held back, and for how long.
        held: list[float] = []
        plan = worker.pacer.core.delay

        def counted_delay(now: float) -> Any:
            delay, reason = plan(now)
            if delay > 0:
                held.append(delay)
            return delay, reason

        worker.pacer.core.delay = counted_delay  # type: ignore[method-assign]
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        result = await worker.run_pass()
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    waits.sort()
    extra = {
        "stopped": result.stopped,
        "pacer_held_back": len(held),
        "pacer_longest_hold_ms": round(1000 * max(held), 1) if held else 0.0,
        "pacer_wait_sum_s": round(sum(waits), 3),
        "pacer_wait_max_ms": round(1000 * waits[-1], 1) if waits else 0.0,
        "pacer_waits_over_10ms": sum(1 for w in waits if w > 0.01),
    }
    return Timing(wall, cpu, result.reads, dict(result.counts), extra)


async def _readers(
    read_user: Callable[[str, str, Counter[str]], Awaitable[None]],
    tokens: Sequence[tuple[str, str]],
) -> Timing:
    statuses: Counter[str] = Counter()
    pending = iter(tokens)

    async def reader() -> None:
        for user, token in pending:
            await read_user(user, token, statuses)

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(CONCURRENCY):
            tg.start_soon(reader)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return Timing(wall, cpu, sum(statuses.values()), dict(statuses), {})


async def baseline_pass(settings: Any, tokens: Sequence[tuple[str, str]]) -> Timing:
    """The same reads with plain httpx: no decryption, pacing, classification or storage."""
    from lta_worker.simulator import DEMO_CLIENT_SECRET

    base_url = settings.service.base_url
    limits = httpx.Limits(
        max_connections=CONCURRENCY + 1, max_keepalive_connections=CONCURRENCY + 1
    )
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0, connect=5.0), limits=limits) as http:

        async def read_user(_user: str, token: str, statuses: Counter[str]) -> None:
            auth = {"Authorization": f"Bearer {token}.{DEMO_CLIENT_SECRET}"}
            for path in PATHS:
                response = await http.get(base_url + path, headers=auth)
                _ = response.content
                statuses[str(response.status_code)] += 1

        return await _readers(read_user, tokens)


async def api_pass(settings: Any, tokens: Sequence[tuple[str, str]]) -> Timing:
    """The same reads through the worker's HTTP layer only (`http_client` + `ApiClient`)."""
    from lta_worker.secret import Secret
    from lta_worker.simulator import DEMO_CLIENT_SECRET
    from lta_worker.upstream import ApiClient, http_client

    async with http_client(settings.service) as http:
        api = ApiClient(http, settings.service, settings.client, Secret(DEMO_CLIENT_SECRET))

        async def read_user(_user: str, token: str, statuses: Counter[str]) -> None:
            for endpoint in ("latest-change", "stats"):
                answer = await api.read(endpoint, Secret(token))
                statuses[str(answer.status)] += 1

        return await _readers(read_user, tokens)


Variant = Callable[[Any, Sequence[tuple[str, str]]], Awaitable[Timing]]
VARIANTS: dict[str, Variant] = {
    "worker": worker_pass,
    "api_client": api_pass,
    "baseline": baseline_pass,
}


@contextmanager
def sniffio_present() -> Iterator[None]:
    """A stand-in `sniffio` (what httpcore looks for on every lock setup), then removed."""
    module = types.ModuleType("sniffio")
    module.current_async_library = lambda: "asyncio"  # type: ignore[attr-defined]
    previous = sys.modules.get("sniffio")
    sys.modules["sniffio"] = module
    try:
        yield
    finally:
        if previous is None:
            del sys.modules["sniffio"]
        else:
            sys.modules["sniffio"] = previous


def _rounds(
    settings: Any,
    tokens: Sequence[tuple[str, str]],
    db_path: Any,
    *,
    rounds: int,
    label: str,
    variants: Sequence[str],
) -> dict[str, list[Timing]]:
    out: dict[str, list[Timing]] = {name: [] for name in variants}
    # An untimed pass first: a user's first results are inserts, later ones (the steady
    # state of a deployment) update snapshots whose content did not change.
    make_all_due(db_path)
    with quiet_logs("info"):
        anyio.run(worker_pass, settings, tokens)
    for i in range(rounds):
        for name in variants:
            make_all_due(db_path)
            with quiet_logs("info"):
                out[name].append(anyio.run(VARIANTS[name], settings, tokens))
        log(
            f"B1 {label} round {i + 1}/{rounds}: "
            + ", ".join(f"{n} {out[n][-1].wall_s:.2f} s ({out[n][-1].reads})" for n in variants)
        )
    return out


# Both reads for every user each round (stats "on_change", the default, reads stats only
# when latest-change moved, and the simulator's content does not move between rounds).
POLL: Final = {"concurrency": CONCURRENCY, "stats": "always"}


def measure_process(users: int, rounds: int) -> dict[str, Any]:
    """The simulator in a child process (separate GIL): all variants, then the sniffio what-if."""
    with Workspace("b1-process") as ws:
        t0 = time.perf_counter()
        with SimProcess(ws.path, users, budget=BUDGET) as sim:
            settings = ws.settings(sim.base_url, sim.auth_url, poll=POLL)
            tokens = sim.tokens()
            store_tokens(settings, tokens)
            log(f"B1: {users} users enrolled and stored in {time.perf_counter() - t0:.1f} s")
            runs = _rounds(
                settings, tokens, ws.db_path, rounds=rounds, label="process", variants=[*VARIANTS]
            )
            with sniffio_present():
                what_if = _rounds(
                    settings,
                    tokens,
                    ws.db_path,
                    rounds=1,
                    label="sniffio",
                    variants=["worker", "baseline"],
                )
    return {"runs": runs, "sniffio": what_if}


def measure_thread(users: int, rounds: int) -> dict[str, list[Timing]]:
    """The simulator on a thread of this process (shares the GIL with the worker)."""
    from bench.simproc import enroll, no_delay, user_ids
    from lta_worker.simulator import Simulator, start_in_thread

    with Workspace("b1-thread") as ws:
        sim = Simulator()
        sim.configure(budget=BUDGET, window=3600)
        tokens = list(enroll(sim, user_ids("u", users)))
        with start_in_thread(sim) as running:
            no_delay(running)
            settings = ws.settings(running.base_url, running.auth_url, poll=POLL)
            store_tokens(settings, tokens)
            return _rounds(
                settings,
                tokens,
                ws.db_path,
                rounds=rounds,
                label="thread",
                variants=["worker", "baseline"],
            )


def _med(timings: list[Timing], fn: Callable[[Timing], float]) -> float:
    return median(fn(t) for t in timings)


def _summary(runs: dict[str, list[Timing]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, timings in runs.items():
        out[name] = {
            "wall_s": _med(timings, lambda t: t.wall_s),
            "reads_per_s": _med(timings, lambda t: t.reads_per_s),
            "cpu_ms_per_read": _med(timings, lambda t: 1000 * t.cpu_s / t.reads),
            "rounds": [t.row() for t in timings],
        }
    out["ratio"] = out["baseline"]["wall_s"] / out["worker"]["wall_s"]
    return out


def run(size: Size) -> BenchResult:
    """Run B1 and return its figures."""
    users = {"full": 2000, "quick": 500, "smoke": 20}[size]
    rounds = 1 if size == "smoke" else 3
    result = BenchResult("B1", f"overhead: a pass over {users:,} users vs plain httpx")
    process = measure_process(users, rounds)
    main = _summary(process["runs"])
    sniffio = _summary(process["sniffio"])
    thread = _summary(measure_thread(users, {"full": 1, "quick": 2, "smoke": 1}[size]))
    costs = b1_breakdown.engine_costs(users=min(users, 1000))
    worker, api, base = main["worker"], main["api_client"], main["baseline"]
    result.details = {
        "users": users,
        "reads_per_pass": 2 * users,
        "concurrency": CONCURRENCY,
        "budget": f"{BUDGET} per 3600 s",
        "rounds": rounds,
        "sniffio_installed": b1_breakdown.sniffio_installed(),
        "simulator_in_child_process": main,
        "with_sniffio_stand_in": sniffio,
        "simulator_on_thread": thread,
        "turn_costs_us_per_read": costs,
    }
    result.add(
        "worker CPU per read",
        worker["cpu_ms_per_read"],
        "ms",
        # Issue 40: an absolute bound. The budget (about 120 requests an hour), not the CPU,
        # bounds this worker; a ratio to plain httpx only measured the HTTP pool's races.
        at_most=2.0,
        note=f"simulator in its own process; median of {rounds} rounds",
    )
    result.add("baseline_time / worker_time", main["ratio"], "x")
    result.add("worker reads/s", worker["reads_per_s"], "reads/s")
    result.add("baseline reads/s", base["reads_per_s"], "reads/s")
    result.add("ApiClient-only reads/s", api["reads_per_s"], "reads/s", note="worker HTTP layer")
    result.add("ApiClient-only CPU per read", api["cpu_ms_per_read"], "ms")
    result.add("baseline CPU per read", base["cpu_ms_per_read"], "ms")
    result.add(
        "ratio, simulator on a thread",
        thread["ratio"],
        "x",
        note="shares the GIL with the worker: comparison only",
    )
    result.add(
        "ratio with sniffio importable",
        sniffio["ratio"],
        "x",
        note=f"what-if; worker {sniffio['worker']['reads_per_s']:.0f} reads/s, "
        f"baseline {sniffio['baseline']['reads_per_s']:.0f} reads/s",
    )
    worker_rounds = worker["rounds"]
    longest = median(r["pacer_wait_max_ms"] for r in worker_rounds)
    result.add(
        "permits the pacer held back in a pass",
        median(r["pacer_held_back"] for r in worker_rounds),
        "",
        note=f"of {2 * users:,} reads at 10**9/h; longest wait for a permit {longest:.0f} ms",
    )
    for name, value in sorted(costs.items(), key=lambda kv: -kv[1])[:5]:
        result.add(f"  turn cost: {name}", value, "us/read")
    return result
