"""What the database says: `status`, health and the JSON shapes of users and results
(`_status`), the freshness and capacity plans (`_plan`).

Below `worker` and above `runtime`, so that `status`, `users list` and `results export`
start without importing the worker (anyio, structlog, httpx, APScheduler).
"""

from __future__ import annotations

from lta_worker.report._plan import PlanCache, budget_moved, capacity_plan, schedule_summary
from lta_worker.report._status import assess_health, collect_status, iso, result_json, user_json

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
