"""What the database says, read without the runtime: `status`, health and the freshness plan.

- `collect_status`: everything `status`, `check` and `/healthz` show, from the database
  opened read-only; `assess_health`, the verdict, pure (`_status`);
- `schedule_summary`: the schedule `status` shows; `PlanCache`: the freshness plan a pass
  uses, made again every few minutes (`_plan`);
- `open_store_readonly`: the database as the read-only commands open it, its schema
  checked and never migrated; `instance_ttl`: how long an instance counts as live (`_read`).

It sits below `worker`, so that `status`, `users list` and `results export` start without
importing the runtime (anyio, structlog, httpx, APScheduler).
"""

from __future__ import annotations

from lta_worker.report._plan import PlanCache, schedule_summary
from lta_worker.report._read import instance_ttl, open_store_readonly
from lta_worker.report._status import assess_health, collect_status

__all__ = [
    "PlanCache",
    "assess_health",
    "collect_status",
    "instance_ttl",
    "open_store_readonly",
    "schedule_summary",
]
