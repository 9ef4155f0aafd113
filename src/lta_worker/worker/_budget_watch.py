"""While an adaptive pass runs: its freshness plan made again as soon as the budget the
service reports moves from the one the plan was made from (`report.budget_moved`).

A pass goes on while users are due, so usually over all of them: a plan made before the
first answer of a new install (from `ratelimit.fallback_per_hour`), or before the service
raised or lowered the client's quota, would otherwise space every user it reads for a
budget that is not there, until their next reads, hours later.

Each read's answer is compared with the plan's budget (in memory, `on_read`); once it
moved, the budget is stored as after a pass (`jobs.keep_budget`, the one path by which a
report reaches `store.budget_seen`) and the plan made again from it on a worker thread
(`PlanCache.get`), and the engine decides the turns from then on with it (`follow_plan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from lta_worker.report import budget_moved
from lta_worker.worker import _jobs as jobs

if TYPE_CHECKING:
    from lta_worker.worker._engine import PassEngine
    from lta_worker.worker._runtime import Worker


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
            await jobs.keep_budget(rt)
            plan = await anyio.to_thread.run_sync(
                rt.plans.get, rt.store, rt.settings, rt.settings.poll.policy(), rt.clock.now()
            )
            engine.follow_plan(plan)
            if rt.metrics is not None:
                rt.metrics.on_plan(plan)
            # Only now: the reads answered meanwhile are compared with the new plan's budget.
            self._moved = anyio.Event()
