"""What the database says: `status`, health, the JSON shapes of users and results, and the
freshness and capacity plans; without the worker's imports, so that `status` starts light."""

from __future__ import annotations

from lta_worker.report._status import (
    PlanCache,
    assess_health,
    budget_moved,
    capacity_plan,
    collect_status,
    iso,
    result_json,
    schedule_summary,
    user_json,
)

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
