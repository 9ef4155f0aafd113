"""docs/log-events.md lists the values the code logs: `enroll.failed`'s stages and its own
codes, and the `job` of `serve`'s `error` events."""

from __future__ import annotations

import re
from pathlib import Path

from lta_worker.enrollment._enroll import FAILURE_STAGES, STATE_FAILURES
from lta_worker.worker._metrics_http import SERVER_JOBS
from lta_worker.worker._serve import JOB_IDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "log-events.md"


def documented_values(event: str, field: str) -> set[str]:
    """The values the event table lists for `field` of `event`: "`field` (`v1`, `v2`)"."""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] == f"`{event}`":
            found = re.search(rf"`{field}` \(([^)]*)\)", cells[3])
            assert found, f"{event}: no values listed for {field}"
            return set(re.findall(r"`([^`]+)`", found.group(1)))
    raise AssertionError(f"{event} is not in the event table")


def test_enroll_failed_lists_every_stage_and_state_code() -> None:
    """`enroll.failed`: every `stage` the code logs, and the codes of stage `state`."""
    assert documented_values("enroll.failed", "stage") == set(FAILURE_STAGES)
    assert set(STATE_FAILURES) <= documented_values("enroll.failed", "error_code")


def test_error_lists_every_job_of_serve() -> None:
    """The `error` event's `job`: exactly the jobs `serve` schedules and those of its
    metrics server."""
    assert documented_values("error", "job") == set(JOB_IDS) | set(SERVER_JOBS)
