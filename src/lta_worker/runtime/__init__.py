"""The composition root, for every command: `Runtime` (`_root`) and the injected `Clock`
(`_clock`). Below `report` and `worker`, above storage, upstream, pacing, enrollment and
config; what it builds is imported where it is built, so `status` starts light.
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
