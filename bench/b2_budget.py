"""B2 budget use: how much of each window's allowance a pass uses, and whether it ever gets a 429.

The simulator (on a thread of this process: the pacing, not the CPU, sets the pace here)
counts a small budget per short fixed window, aligned to the epoch like many gateways.
More users are due than the budget can serve, so the pass must pace itself across windows.
It starts just after a window boundary and runs (`--max-duration`) until just past the end
of the last measured window. The simulator's own request log, bucketed into its windows,
gives reads per window; the allowance is the budget less the configured reserve
(`ratelimit.reserve`, 10 % by default), which the worker leaves for the client's other
traffic. The first window holds the pacer's start (a blind burst, then learning the
budget) and is reported apart; the windows after it are the measured ones.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from datetime import timedelta
from typing import Any, cast

import anyio

from bench.common import BenchResult, Size, Workspace, log, median, quiet_logs, store_tokens
from lta_worker.protocol import READ_PATHS

CONCURRENCY = 8


async def _pass(settings: Any, seconds: float) -> Any:
    from lta_worker.worker import Worker

    async with Worker(settings, kind="run") as worker:
        return await worker.run_pass(max_duration=timedelta(seconds=seconds))


def run(size: Size) -> BenchResult:
    """Run B2 and return its figures."""
    from bench.simproc import enroll, no_delay, user_ids
    from lta_worker.simulator import Simulator, start_in_thread

    budget, window, measured = {"full": (200, 20, 3), "quick": (60, 6, 2), "smoke": (20, 2, 1)}[
        size
    ]
    reserve = 0.1
    allowance = budget - math.floor(reserve * budget)
    result = BenchResult(
        "B2", f"budget use: {budget} per {window} s window, {measured} measured windows"
    )
    # Two reads per user; enough users that the pass never runs out of due reads.
    users = (measured + 2) * budget
    sim = Simulator()
    sim.configure(budget=budget, window=window)
    tokens = list(enroll(sim, user_ids("b2", users)))
    with Workspace("b2") as ws, start_in_thread(sim) as running:
        no_delay(running)
        settings = ws.settings(
            running.base_url,
            running.auth_url,
            poll={"concurrency": CONCURRENCY},
            ratelimit={"reserve": reserve},
        )
        store_tokens(settings, tokens)
        # Start just after a window boundary (bounded: at most one window's wait).
        now = time.time()
        start_at = (math.floor(now / window) + 1) * window + 0.05
        time.sleep(max(0.0, start_at - now))
        first = math.floor(time.time() / window)
        # Run through the last measured window and half a second into the next.
        seconds = (first + measured + 1) * window + 0.5 - time.time()
        sim.clear_requests()
        log(f"B2: pass of {seconds:.0f} s over {users} users ({budget} per {window} s)")
        with quiet_logs("info"):
            outcome = anyio.run(_pass, settings, seconds)
        entries = [e for e in sim.requests() if e.path in READ_PATHS.values()]
    allowed: Counter[int] = Counter()
    refused: Counter[int] = Counter()
    for entry in entries:
        bucket = math.floor(entry.at.timestamp() / window) - first
        (refused if entry.status == 429 else allowed)[bucket] += 1
    windows = list(range(1, measured + 1))
    shares = [allowed[w] / allowance for w in windows]
    result.details = {
        "budget": budget,
        "window_s": window,
        "reserve": reserve,
        "allowance_per_window": allowance,
        "users": users,
        "concurrency": CONCURRENCY,
        "pass_stopped": outcome.stopped,
        "pass_reads": outcome.reads,
        "first_window_reads": allowed[0],
        "reads_per_window": {str(w): allowed[w] for w in sorted(allowed)},
        "refused_429_per_window": {str(w): refused[w] for w in sorted(refused)},
        "measured_windows": windows,
        "share_per_measured_window": [round(s, 4) for s in shares],
    }
    result.add(
        "reads per window / (budget - reserve)",
        sum(shares) / len(shares),
        "x",
        at_least=0.97,
        note=f"mean of {measured} windows; allowance {allowance} = {budget} - {reserve:.0%}",
    )
    result.add("worst window", min(shares), "x", at_least=0.97)
    result.add("429 answers in the pass", sum(refused.values()), "", at_most=0)
    result.add(
        "reads in the first window",
        allowed[0],
        "reads",
        note=f"pacer start-up (of {allowance}); not in the mean",
    )
    result.add("median reads per measured window", median(allowed[w] for w in windows), "reads")
    _virtual_hours(result, size)
    return result


def _virtual_hours(result: BenchResult, size: Size) -> None:  # noqa: PLR0915
    """The hour-long variant on virtual time (see the module's docstring)."""
    from lta_worker.config import RateLimitSettings
    from lta_worker.pacing import RECHECK, PacerCore, RateLimitInfo

    limit, window, reserve, latency, concurrency = 120, 3600.0, 0.1, 0.4, CONCURRENCY
    hours = {"full": 24, "quick": 6, "smoke": 2}[size]
    allowance = limit - math.floor(reserve * limit)
    # No other traffic, as in the real-time windows: the worker alone against the budget.
    others: list[float] = []
    used = [0] * hours
    worker = [0] * hours
    refused = 0
    core = PacerCore(RateLimitSettings(reserve=reserve, fallback_per_hour=60.0), initial_burst=5)
    events: list[tuple[float, int, str, tuple[object, ...]]] = []
    queue = deque(range(concurrency))
    counter = 0

    def push(t: float, kind: str, *data: object) -> None:
        nonlocal counter
        heapq.heappush(events, (t, counter, kind, data))
        counter += 1

    push(0.0, "check")
    while events:
        t, _, kind, data = heapq.heappop(events)
        if t >= hours * window:
            break
        if kind == "check":
            if not queue:
                continue
            delay, _ = core.delay(t)
            if delay > 0:
                push(t + min(delay, RECHECK), "check")
                continue
            core.reserve(t)
            queue.popleft()
            i = int(t // window)
            while others and others[0] <= t:
                used[int(others.pop(0) // window)] += 1
            ok = used[i] < limit
            used[i] += ok
            worker[i] += 1
            refused += not ok
            left = (i + 1) * window - t
            info = RateLimitInfo(limit, max(0, limit - used[i]), left, window, None, "model")
            push(t + latency, "answer", 200 if ok else 429, info, t)
            push(t, "check")
        else:
            status, info, sent = cast(tuple[int, RateLimitInfo, float], data)
            core.observe(t, info, status, sent_at=sent)
            queue.append(0)
            if len(queue) == 1:
                push(t, "check")
    measured = list(range(1, hours))
    shares = [worker[w] / allowance for w in measured]
    result.details["virtual_hours"] = {
        "limit_per_hour": limit,
        "reserve": reserve,
        "allowance_per_window": allowance,
        "hours": hours,
        "latency_s": latency,
        "worker_reads_per_window": worker,
        "refused_429": refused,
    }
    note = f"virtual time, {hours - 1} hour-long windows of {limit} less {reserve:.0%}"
    result.add(
        "hour windows: reads / (budget - reserve)",
        sum(shares) / len(shares),
        "x",
        at_least=0.97,
        note=note,
    )
    result.add("hour windows: worst window", min(shares), "x", at_least=0.97)
    result.add(
        "hour windows: most worker reads in a window",
        max(worker),
        "reads",
        at_most=allowance,
        note="never more than the budget less the reserve",
    )
    result.add("hour windows: 429 answers", refused, "", at_most=0)
