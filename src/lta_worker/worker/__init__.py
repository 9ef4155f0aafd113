"""The runtime: one pass over the due users, the `Worker` that runs passes, and `serve`.

- `PassEngine` (`_engine`): claim, read, classify, decide, write; a user's turn and the
  pass's log lines (`_turn`); options, result, stop and leases (`_pass`);
- `Worker` (`_runtime`): passes over a `runtime.Runtime`, with the jobs around them
  (`_jobs`) and the plan made again when the budget moves (`REPLAN_GAP`);
- `serve` (`_serve`): the service under systemd, its scheduler, reload and sd_notify
  (`_scheduler`), its listeners (`_listen`, `_metrics_http`, `_enroll`);
- `CheckResult`, `run_checks`: what `check` verifies before a deployment (`_check`).
"""

from __future__ import annotations

from lta_worker.worker._check import CheckResult, run_checks
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, pass_options, stop_error
from lta_worker.worker._runtime import REPLAN_GAP, Worker
from lta_worker.worker._serve import serve

__all__ = [
    "REPLAN_GAP",
    "CheckResult",
    "PassEngine",
    "PassOptions",
    "PassResult",
    "ProgressFn",
    "Worker",
    "pass_options",
    "run_checks",
    "serve",
    "stop_error",
]
