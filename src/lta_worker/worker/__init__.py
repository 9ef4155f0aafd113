"""The worker: one pass (`PassEngine`), the `Worker` that runs passes and their jobs,
`serve`, and what `check` verifies (`run_checks`)."""

from __future__ import annotations

from lta_worker.worker._check import run_checks
from lta_worker.worker._engine import PassEngine
from lta_worker.worker._pass import PassOptions, PassResult, ProgressFn, pass_options, stop_error
from lta_worker.worker._runtime import REPLAN_GAP, Worker
from lta_worker.worker._serve import serve

__all__ = [
    "REPLAN_GAP",
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
