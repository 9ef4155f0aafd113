"""How one pass runs and how it ended: options in, result out (plain data)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lta_worker.domain import OUTCOME_KINDS, Endpoint, PolicyConfig, StopReason
from lta_worker.pacing import DEFAULT_MAX_WAIT

if TYPE_CHECKING:
    from lta_worker.worker._engine import PassEngine


@dataclass(frozen=True, slots=True)
class PassOptions:
    """How one pass runs; built from settings by `pass_options` (`_runtime`)."""

    instance: str
    client_scopes: tuple[str, ...]
    policy: PolicyConfig
    max_duration: timedelta
    concurrency: int = 8
    batch_size: int = 100
    lease_duration: timedelta = timedelta(minutes=5)
    breaker_threshold: int = 5
    upstream_down_after: int = 20
    grace: timedelta = timedelta(seconds=10)
    max_wait: float = DEFAULT_MAX_WAIT


@dataclass(slots=True)
class PassResult:
    """How a pass ended and what it did."""

    stopped: StopReason
    exit_code: int
    users: int = 0
    reads: int = 0
    throttled: int = 0
    wall_s: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        """The fields of the `pass.finished` event."""
        counts: dict[str, int] = {kind: self.counts.get(kind, 0) for kind in OUTCOME_KINDS}
        return {
            "stopped": self.stopped,
            "exit_code": self.exit_code,
            "users": self.users,
            "reads": self.reads,
            "throttled": self.throttled,
            "wall_s": round(self.wall_s, 3),
            **counts,
        }


ProgressFn = Callable[["PassEngine"], None]
ReadObserver = Callable[[Endpoint, str, float], None]
"""Told of every read: the endpoint, the outcome's kind, the seconds it took (metrics)."""
