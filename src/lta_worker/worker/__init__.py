"""The runtime: one pass over the due users, the `Worker` that builds passes, and `serve`.

- `PassEngine`, `PassOptions`, `PassResult`: claim, read, classify, decide, write (`_engine`);
- `Worker`: everything a pass needs, opened once, for `run` and `serve` (`_runtime`);
- `serve`: the long-running service under systemd (APScheduler, sd_notify) (`_serve`);
- `services`, `open_store`, `load_vault`: the real collaborators built from settings, and
  the entry point of a web application (`_wiring`);
- `Clock`, `SystemClock`: time, injected (`_clock`).

Names are imported on first use (see `lta_worker._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lta_worker._lazy import lazy_attributes

if TYPE_CHECKING:
    from lta_worker.worker._clock import Clock, SystemClock
    from lta_worker.worker._engine import (
        EXIT_CODES,
        PassEngine,
        PassOptions,
        PassResult,
        ProgressFn,
    )
    from lta_worker.worker._runtime import Worker
    from lta_worker.worker._serve import serve
    from lta_worker.worker._wiring import Services, instance_ttl, load_vault, open_store, services

_NAMES = {
    "EXIT_CODES": "._engine",
    "PassEngine": "._engine",
    "PassOptions": "._engine",
    "PassResult": "._engine",
    "ProgressFn": "._engine",
    "Worker": "._runtime",
    "instance_ttl": "._wiring",
    "serve": "._serve",
    "Services": "._wiring",
    "load_vault": "._wiring",
    "open_store": "._wiring",
    "services": "._wiring",
    "Clock": "._clock",
    "SystemClock": "._clock",
}
__getattr__ = lazy_attributes(__name__, _NAMES)
__all__ = [
    "EXIT_CODES",
    "Clock",
    "PassEngine",
    "PassOptions",
    "PassResult",
    "ProgressFn",
    "Services",
    "SystemClock",
    "Worker",
    "instance_ttl",
    "load_vault",
    "open_store",
    "serve",
    "services",
]
