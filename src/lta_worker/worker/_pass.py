"""How one pass runs and how it ended: options in, result out (plain data)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lta_worker.domain import EXIT_CODES, OUTCOME_KINDS, Endpoint, PolicyConfig, StopReason, Trip
from lta_worker.errors import PassStoppedError

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.worker._engine import PassEngine


@dataclass(frozen=True, slots=True)
class PassOptions:
    """How one pass runs; built from settings by `pass_options` below, the one home
    of every default."""

    instance: str
    client_scopes: tuple[str, ...]
    policy: PolicyConfig
    max_duration: timedelta
    concurrency: int
    batch_size: int
    lease_duration: timedelta
    breaker_threshold: int
    upstream_down_after: int
    grace: timedelta
    max_wait: float
    # `service.request_timeout`: a read is sent only this long (at most a renewal period)
    # before its user's lease may lapse, so that it ends within the lease.
    request_timeout: timedelta


def pass_options(settings: Settings, instance: str, max_duration: timedelta | None) -> PassOptions:
    """Pass options from settings (`--max-duration` overrides `poll.max_pass_duration`)."""
    poll = settings.poll
    return PassOptions(
        instance=instance,
        client_scopes=settings.client.scopes,
        policy=poll.policy(),
        max_duration=max_duration or poll.max_pass_duration,
        concurrency=poll.concurrency,
        batch_size=poll.batch_size,
        lease_duration=poll.lease_duration,
        breaker_threshold=poll.breaker_threshold,
        upstream_down_after=max(20, 2 * poll.concurrency),
        grace=settings.serve.grace_period,
        max_wait=settings.ratelimit.max_wait.total_seconds(),
        request_timeout=settings.service.request_timeout,
    )


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
    cause: Trip | None = None  # the breaker's, when it stopped the pass

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


# Why a pass stopped early, and what to do: the `error` event a failing `run` (or a `serve`
# stopped by the breaker) ends with, after the pass's own events.
_STOPS: dict[StopReason, tuple[str, str | None]] = {
    "deadline": (
        "the pass reached its maximum duration (--max-duration, else poll.max_pass_duration) "
        "with users still due; they stay due for the next pass",
        "if every pass ends so, the budget cannot read every user each poll.interval",
    ),
    "upstream_down": (
        "the service could not be reached or kept failing (network failures, 5xx); users "
        "not read stay due, and those whose read failed are backed off",
        "see the pass.unreachable and poll.read events above; check service.base_url, DNS, "
        "the firewall and service.https_proxy",
    ),
    "throttled": (
        "every read was refused with 429: the client's budget is spent by other traffic; "
        "the users stay due",
        "leave more of the budget to lta-worker, or raise ratelimit.reserve",
    ),
    "cancelled": (
        "the pass was stopped by a signal (SIGTERM or Ctrl-C); users not read stay due",
        None,
    ),
    "breaker": (
        "the circuit breaker stopped the pass: the service rejected the client or its URLs "
        "(see pass.breaker_tripped); no user was changed",
        "check client.secret_file and service.base_url",
    ),
    "config": ("a configuration problem stopped the pass (see the error above)", None),
}


def stop_error(stopped: StopReason) -> PassStoppedError:
    """The error that ends a process whose pass stopped early (`stopped` not `completed`)."""
    message, hint = _STOPS[stopped]
    return PassStoppedError(message, exit_code=EXIT_CODES[stopped], reason=stopped, hint=hint)


ProgressFn = Callable[["PassEngine"], None]
ReadObserver = Callable[[Endpoint, str, float], None]
"""Told of every read: the endpoint, the outcome's kind, the seconds it took (metrics)."""
