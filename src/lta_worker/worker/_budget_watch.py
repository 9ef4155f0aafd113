"""While an adaptive pass runs: its freshness plan made again as soon as the budget the
service reports moves from the one the plan was made from (`report.budget_moved`).

A pass goes on while users are due, so usually over all of them: a plan made before the
first answer of a new install (from `ratelimit.fallback_per_hour`), or before the service
raised or lowered the client's quota, would otherwise space every user it reads for a
budget that is not there, until their next reads, hours later.

Each read's answer is compared with the plan's budget (in memory, `on_read`); once it
moved, the budget is stored as after a pass (`jobs.keep_budget`, the one path by which a
report reaches `store.budget_seen`; on PostgreSQL with a shared budget, the shared row
settles it) and the plan made again on a worker thread from the pacer's own reading
(`PlanCache.get`, which the shared row may not hold yet), and the engine decides the turns
from then on with it (`follow_plan`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

import anyio

from lta_worker.report import budget_moved
from lta_worker.worker import _jobs as jobs

if TYPE_CHECKING:
    from lta_worker.domain import BudgetSeen, SchedulePlan
    from lta_worker.worker._engine import PassEngine
    from lta_worker.worker._runtime import Worker


REPLAN_GAP: Final = timedelta(seconds=60)
"""The least time between two re-plans of one pass: a budget that keeps swinging, or a
shared row on PostgreSQL that lags the pacer's own reading, costs at most one scan of the
users table (or one read of the budget row) per `REPLAN_GAP`, not one per read."""


async def make_plan(rt: Worker, seen: BudgetSeen | None = None) -> SchedulePlan:
    """The freshness plan from the runtime's cache (a scan of the users table when it is
    made again, so on a worker thread), from `seen` or the budget stored; reported to the
    metrics."""
    plan = await anyio.to_thread.run_sync(
        rt.plans.get, rt.store, rt.settings, rt.settings.poll.policy(), rt.clock.now(), seen
    )
    if rt.metrics is not None:
        rt.metrics.on_plan(plan)
    return plan


class BudgetWatch:
    """The engine's read observer (`on_read`) and the job alongside the pass (`run`)."""

    def __init__(self, rt: Worker) -> None:
        self._rt = rt
        self._moved = anyio.Event()

    def on_read(self, endpoint: str, outcome: str, duration_s: float) -> None:
        """After each read (the pacer fed its answer): wake `run` if the budget moved."""
        rt = self._rt
        if rt.metrics is not None:
            rt.metrics.on_read(endpoint, outcome, duration_s)
        if rt.settings.poll.schedule != "adaptive" or self._moved.is_set():
            return
        if budget_moved(rt.plans.seen, rt.pacer.budget_seen(rt.clock.now())):
            self._moved.set()

    async def run(self, engine: PassEngine) -> None:
        """Until cancelled: each time the budget moved, store it, plan again, follow."""
        rt = self._rt
        while True:
            await self._moved.wait()
            seen = rt.pacer.budget_seen(rt.clock.now())
            await jobs.keep_budget(rt)
            engine.follow_plan(await make_plan(rt, seen))
            await rt.clock.sleep(REPLAN_GAP.total_seconds())
            # Only now: the reads answered meanwhile are compared with the new plan's budget.
            self._moved = anyio.Event()
