"""The runtime: one pass over the due users, the `Worker` that builds passes, and `serve`.

- `PassEngine`: claim, read, classify, decide, write (`_engine`): one user's turn
  (`_turn`), the single writer (`_writer`), how a pass stops (`_stop`), with the narrow
  protocols it needs of its collaborators (`_ports`) and its log lines (`_pass_log`);
- `PassOptions`, `PassResult`: how a pass runs and how it ended (`_pass`);
- `Worker`: everything a pass needs, opened once, for `run` and `serve` (`_runtime`); the
  pass with its jobs around it (`_run`); the periodic jobs, each a function of the
  runtime (`_jobs`);
- `serve`: the long-running service under systemd (`_serve`), its APScheduler jobs
  (`_scheduler`), sd_notify (`_sdnotify`);
- `services`, `open_store`, `load_vault`: the real collaborators built from settings, and
  the entry point of a web application (`_wiring`);
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
    from lta_worker.worker._runtime import Worker
    from lta_worker.worker._serve import serve
    from lta_worker.worker._status import assess_health, collect_status
    from lta_worker.worker._wiring import (
        Services,
        instance_ttl,
        load_vault,
        open_store,
        open_store_readonly,
        services,
    )

_NAMES = {
    "PassEngine": "._engine",
    "PassOptions": "._pass",
    "PassResult": "._pass",
    "ProgressFn": "._pass",
    "stop_error": "._pass",
    "schedule_summary": "._plan",
    "Worker": "._runtime",
    "instance_ttl": "._wiring",
    "serve": "._serve",
    "assess_health": "._status",
    "collect_status": "._status",
    "Services": "._wiring",
    "load_vault": "._wiring",
    "open_store": "._wiring",
    "open_store_readonly": "._wiring",
    "services": "._wiring",
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
    "Services",
    "SystemClock",
    "Worker",
    "assess_health",
    "collect_status",
    "instance_ttl",
    "load_vault",
    "open_store",
    "open_store_readonly",
    "run_checks",
    "schedule_summary",
    "serve",
    "services",
    "stop_error",
]
