"""The runtime: one pass over the due users, the `Worker` that builds passes, and `serve`.

- `PassEngine`: claim, read, classify, decide, write (`_engine`): one user's turn
  (`_turn`), the single writer (`_writer`), how a pass stops (`_stop`), with the narrow
  protocols it needs of its collaborators (`_ports`) and its log lines (`_pass_log`);
- `PassOptions`, `PassResult`: how a pass runs and how it ended (`_pass`);
- `Runtime`: the composition root, built once from settings: store, vault, API client,
  pacer and clock, for every command, `check`, the enrollment web app and a web
  application embedding enrollment (`_root`);
- `Worker`: passes over a runtime, for `run` and `serve` (`_runtime`); the pass with its
  jobs around it (`_run`); the periodic jobs, each a function of the runtime (`_jobs`);
- `serve`: the long-running service under systemd (`_serve`), its APScheduler jobs
  (`_scheduler`), sd_notify (`_sdnotify`);
- `Clock`, `SystemClock`: time, injected (`_clock`).

Names are imported on first use (see `lta_worker._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lta_worker._lazy import lazy_attributes

if TYPE_CHECKING:
    from lta_worker.worker._check import CheckResult, run_checks
    from lta_worker.worker._clock import Clock, SystemClock
    from lta_worker.worker._engine import PassEngine
    from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, stop_error
    from lta_worker.worker._plan import schedule_summary
    from lta_worker.worker._root import Runtime, instance_ttl
    from lta_worker.worker._runtime import Worker
    from lta_worker.worker._serve import serve
    from lta_worker.worker._status import assess_health, collect_status

_NAMES = {
    "PassEngine": "._engine",
    "PassOptions": "._pass",
    "PassResult": "._pass",
    "ProgressFn": "._pass",
    "stop_error": "._pass",
    "schedule_summary": "._plan",
    "Worker": "._runtime",
    "instance_ttl": "._root",
    "Runtime": "._root",
    "serve": "._serve",
    "assess_health": "._status",
    "collect_status": "._status",
    "Clock": "._clock",
    "CheckResult": "._check",
    "run_checks": "._check",
    "SystemClock": "._clock",
}
__getattr__ = lazy_attributes(__name__, _NAMES)
__all__ = [
    "CheckResult",
    "Clock",
    "PassEngine",
    "PassOptions",
    "PassResult",
    "ProgressFn",
    "Runtime",
    "SystemClock",
    "Worker",
    "assess_health",
    "collect_status",
    "instance_ttl",
    "run_checks",
    "schedule_summary",
    "serve",
    "stop_error",
]
