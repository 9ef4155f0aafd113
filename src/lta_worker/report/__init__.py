"""What the database says: `status`, health and the freshness plan.

- `collect_status`: everything `status`, `check` and `/healthz` show, from the database
  opened through a read-only `runtime.Runtime`; `assess_health`, the verdict, pure
  (`_status`);
- `schedule_summary`: the schedule `status` shows; `capacity_plan`: the capacity plan
  from the settings in force; `PlanCache`: the freshness plan a pass uses, made again
  every few minutes or once the budget reported moved (`budget_moved`) (`_plan`);
- `user_json`, `result_json`: a user and a result as `users list --format json` and
  `results export` show them, times by `iso` (`_records`).

It sits below `worker` and above `runtime`, so that `status`, `users list` and
`results export` start without importing the worker (anyio, structlog, httpx, APScheduler).
"""

from __future__ import annotations

from lta_worker.report._plan import PlanCache, budget_moved, capacity_plan, schedule_summary
from lta_worker.report._records import iso, result_json, user_json
from lta_worker.report._status import assess_health, collect_status

__all__ = [
    "PlanCache",
    "assess_health",
    "budget_moved",
    "capacity_plan",
    "collect_status",
    "iso",
    "result_json",
    "schedule_summary",
    "user_json",
]
