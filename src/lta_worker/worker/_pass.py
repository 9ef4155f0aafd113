"""What one pass runs with and how it ends: options, result, its stop (`PassStop`), and
until when it certainly holds each claimed user's lease (`LeaseBook`). No I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, TypeVar

import anyio
from anyio.abc import TaskGroup

from lta_worker.domain import (
    EXIT_CODES,
    OUTCOME_KINDS,
    Answer,
    Endpoint,
    PolicyConfig,
    Proof,
    StopReason,
    Trip,
    UserRow,
)
from lta_worker.errors import PassStoppedError
from lta_worker.pacing import PacerLike, Permit
from lta_worker.runtime import Clock
from lta_worker.secret import Secret

if TYPE_CHECKING:
    from lta_worker.config import Settings
    from lta_worker.worker._engine import PassEngine


@dataclass(frozen=True, slots=True)
class PassOptions:
    """How one pass runs; built from settings by `pass_options`, the one home of every default."""

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


# Why a pass stopped early, and what to do (the `error` event a failing `run` ends with).
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


T = TypeVar("T")
ProgressFn = Callable[["PassEngine"], None]
# Told of every read: the endpoint, the outcome's kind, the seconds it took (metrics).
ReadObserver = Callable[[Endpoint, str, float], None]


async def on_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A store call on a worker thread: it may wait for the database while the loop goes on."""
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))


class Reader(Protocol):
    """What the engine needs of the API client (`upstream.ApiClient`)."""

    async def read(self, endpoint: Endpoint, token: Secret) -> Answer:
        """One read with the user's long term token; never raises for HTTP trouble."""
        ...

    async def prove(self, proof: Proof) -> bool | None:
        """Whether the client's credentials or the read URLs are right (no read budget)."""
        ...


# A stop lets reads already sent finish, cancels readers still reading after the grace
# period, and a reader waiting for a permit gives up at once (a tight budget never holds a
# stop); an abort (the breaker, a key id the key file lacks) cancels the pass at once.


class Interrupted(Exception):
    """A turn given up because the pass stopped while it waited for a permit."""


class LeaseLapsed(Interrupted):
    """A turn given up because its user's lease may lapse before a read would end."""


class PassStop:
    """One pass's stop: its reason (the first one asked) and what it cancels."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.reason: StopReason | None = None
        self.requested = anyio.Event()
        self.scope: anyio.CancelScope | None = None  # the pass's, while it runs
        self.tasks: TaskGroup | None = None  # the pass's tasks, while they take new ones
        self._permit_waits: set[anyio.CancelScope] = set()

    def request(self, reason: StopReason, grace: float) -> None:
        """Stop claiming; readers finish their users, cancelled after `grace` (waits at once)."""
        if self.reason is None:
            self.reason = reason
        self.requested.set()
        for scope in self._permit_waits:
            scope.cancel()
        if self.tasks is not None and grace >= 0:
            self.tasks.start_soon(self._cancel_after, grace)

    def abort(self, reason: StopReason) -> None:
        """Stop at once, dropping what is in flight (breaker, fatal configuration error)."""
        self.reason = reason
        self.requested.set()
        if self.scope is not None:
            self.scope.cancel()

    async def _cancel_after(self, grace: float) -> None:
        await self.clock.sleep(grace)
        if self.scope is not None:
            self.scope.cancel()

    async def permit(self, pacer: PacerLike) -> Permit:
        """Wait for a pacer permit; raise `Interrupted` when the pass stops meanwhile."""
        if self.requested.is_set():
            raise Interrupted
        permit: Permit | None = None
        with anyio.CancelScope() as scope:
            self._permit_waits.add(scope)
            try:
                permit = await pacer.acquire()  # cancelled while waiting: nothing taken
            finally:
                self._permit_waits.discard(scope)
        if scope.cancelled_caught:
            raise Interrupted
        if permit is None:  # a broken pacer (or wrapper) must fail loudly, not skip users
            raise TypeError("the pacer's acquire() returned no Permit")
        return permit


# The pass knows a lower bound of each lease's expiry: the claim's `lease_until` (computed
# before the call), raised by a renewal only when it reached the row while the lease was
# held (started after the claim returned, returned before the bound it raises); a lease the
# owner no longer holds is dropped (`users drop` took the user: issue 28). A read is sent
# only while `now + margin` is before the bound, so no other instance reads the user too.
# Kept per (user id, generation): a pass may claim a user again whose lease lapsed while an
# old turn of its own waits for a permit, and that turn must read nothing under the new one.

# A renewal that fails or stalls once still leaves two thirds of the lease to notice.
RENEWALS_PER_LEASE: Final = 3

# A claim's lease: the user's id and the generation (fencing token) the claim gave it.
Lease: TypeAlias = tuple[int, int | None]


def lease_of(user: UserRow) -> Lease:
    """The lease a claimed row was returned with."""
    return (user.id, user.generation)


def renewal_period(lease: timedelta) -> timedelta:
    """How often the pass renews the leases it holds."""
    return lease / RENEWALS_PER_LEASE


def read_margin(lease: timedelta, request_timeout: timedelta) -> timedelta:
    """How long before a lease may lapse the pass stops sending reads for its user."""
    return min(request_timeout, renewal_period(lease))


@dataclass(frozen=True, slots=True)
class Renewal:
    """A renewal in flight: the users it covers (claimed before it) and the expiry it writes."""

    leases: frozenset[Lease]
    lease_until: datetime


class LeaseBook:
    """Per lease claimed, the time until which it is certainly held."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[Lease, datetime] = {}

    def claimed(self, leases: Iterable[Lease], lease_until: datetime) -> None:
        """The leases a claim returned, with the expiry computed before the claim call."""
        for lease in leases:
            self._until[lease] = lease_until

    def renewing(self, lease_until: datetime) -> Renewal:
        """A renewal about to be sent, writing `lease_until`: it covers the leases held now."""
        return Renewal(frozenset(self._until), lease_until)

    def renewed(self, renewal: Renewal, now: datetime, held: Collection[Lease]) -> None:
        """`renewal` returned at `now`, `held` still held: raise those reached in time."""
        for lease in renewal.leases:
            if lease not in held:
                self._until.pop(lease, None)
                continue
            until = self._until.get(lease)
            if until is not None and now < until < renewal.lease_until:
                self._until[lease] = renewal.lease_until

    def forget(self, lease: Lease) -> None:
        """The lease's turn is written or given up: the pass reads under it no more."""
        self._until.pop(lease, None)

    def may_read(self, lease: Lease, now: datetime, margin: timedelta) -> bool:
        """Whether a read sent now ends (within `margin`) before `lease` may lapse."""
        until = self._until.get(lease)
        return until is not None and now + margin < until
