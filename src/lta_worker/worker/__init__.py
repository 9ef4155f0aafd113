"""The runtime: one pass over the due users, the `Worker` that builds passes, and `serve`.

- `PassEngine`: claim, read, classify, decide, write (`_engine`): one user's turn
  (`_turn`), the single writer (`_writer`), how a pass stops (`_stop`), with the narrow
  protocols it needs of its collaborators (`_ports`) and its log lines (`_pass_log`);
- `PassOptions`, `PassResult`: how a pass runs and how it ended, `pass_options` the
  options the settings give (`_pass`);
- `Worker`: passes over a `runtime.Runtime` (the composition root, one layer down), for
  `run` and `serve` (`_runtime`); the pass with its jobs around it (`_run`); the periodic
  jobs, each a function of the runtime (`_jobs`); the freshness plan made again within a
  pass once the budget reported moves, at most every `REPLAN_GAP` (`_budget_watch`);
- `serve`: the long-running service under systemd (`_serve`), its APScheduler jobs
  (`_scheduler`), sd_notify (`_sdnotify`);
- `CheckResult`, `run_checks`: what `check` verifies before a deployment (`_check`).

The composition root and the clock live in `lta_worker.runtime`; what `status` reports and
the freshness plan in `lta_worker.report`.
"""

from __future__ import annotations

from lta_worker.worker._budget_watch import REPLAN_GAP
from lta_worker.worker._check import CheckResult, run_checks
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, pass_options, stop_error
from lta_worker.worker._runtime import Worker
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
