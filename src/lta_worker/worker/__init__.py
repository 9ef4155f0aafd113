"""The runtime: one pass over the due users, the `Worker` that builds passes, and `serve`.

- `PassEngine`: claim, read, classify, decide, write (`_engine`), with the narrow protocols
  it needs of its collaborators (`_ports`) and its log lines (`_pass_log`);
- `PassOptions`, `PassResult`: how a pass runs and how it ended (`_pass`);
- `Worker`: everything a pass needs, opened once, for `run` and `serve` (`_runtime`);
- `serve`: the long-running service under systemd (APScheduler, sd_notify) (`_serve`);
- `services`, `open_store`, `load_vault`: the real collaborators built from settings, and
  the entry point of a web application (`_wiring`);
- `Clock`, `SystemClock`: time, injected (`_clock`);
- `CheckResult`, `run_checks`: what `check` verifies before a deployment (`_check`).

What `status` reports and the freshness plan live one layer down, in `lta_worker.report`.
"""

from __future__ import annotations

from lta_worker.worker._check import CheckResult, run_checks
from lta_worker.worker._clock import Clock, SystemClock
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, stop_error
from lta_worker.worker._runtime import Worker
from lta_worker.worker._serve import serve
from lta_worker.worker._wiring import (
    Services,
    load_vault,
    open_store,
    services,
)

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
    "load_vault",
    "open_store",
    "run_checks",
    "serve",
    "services",
    "stop_error",
]
