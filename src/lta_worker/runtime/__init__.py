"""The composition root, for every command: `Runtime`, built once from settings, owns the
store, the vault, the API client, the pacer and the clock (`_root`).

- `Runtime`: `run` and `serve` hold one through `worker.Worker`; `status`, `users list`,
  `results export` and `check` open a read-only one (the database is never created nor
  migrated); the enrollment web app gets `Runtime.enrollment()`, and the Python API
  (`lta_worker.api`) a runtime that never migrates (`migrate=False`); `instance_ttl`: how
  long an instance counts as live; `missing_key_file`, `READERS`: the key file explained,
  the secret files' readers (`_root`);
- `Clock`, `SystemClock`: time, injected (`_clock`).

It sits below `report` and `worker`, above storage, upstream, pacing, enrollment and
config; what it builds is imported where it is built, so that `status` starts without
the runtime's libraries (anyio, structlog, httpx, APScheduler).
"""

from __future__ import annotations

from lta_worker.runtime._clock import Clock, SystemClock
from lta_worker.runtime._root import READERS, Runtime, instance_ttl, missing_key_file

__all__ = [
    "READERS",
    "Clock",
    "Runtime",
    "SystemClock",
    "instance_ttl",
    "missing_key_file",
]
