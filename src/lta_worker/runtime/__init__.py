"""The composition root, for every command: `Runtime` and the injected `Clock`."""

from __future__ import annotations

from lta_worker.runtime._root import READERS, Clock, Runtime, SystemClock, instance_ttl

__all__ = [
    "READERS",
    "Clock",
    "Runtime",
    "SystemClock",
    "instance_ttl",
]
