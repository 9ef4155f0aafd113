"""Until when a pass certainly holds each claimed user's lease (pure: no I/O, takes times).

A lease in the database ends at the expiry last written for it. The pass knows a lower
bound of that: a claim's `lease_until` (computed before the claim call, so the claim wrote
it or a later one). A renewal raises the bound to its own expiry only when it is known to
have reached the row while the lease was still held: it started after the user's claim had
returned, and it returned before the bound it raises (a renewal that lands after the lease
lapsed may find the user claimed by another instance meanwhile; the time it was stalled is
never counted as held). A read is sent only while `now + margin` is before the bound, so it
ends within the lease: no other instance can claim the user and read it too. A renewal also
says which leases the owner still holds: one ended by another meanwhile (`users drop` /
`users forget` end the pass's lease and take the user, a lifecycle command winning) is
read under no more from then on, not until its bound (issue 28). A read sent between the
command's commit and the next renewal still goes out: at most a renewal period's worth.

The margin is `service.request_timeout`, the longest a read takes, but at most a
renewal period: a lease shorter than the timeout (against the advice of docs/config.md)
still leaves a healthy pass room to read, each read bounded by the renewal that follows it.

The book is kept per lease, `(user id, generation)`, not per user: a pass may claim a user
again whose lease lapsed while one of its own turns still waits for a permit (a database
stalled longer than a lease: the claim after it takes the expired lease over, the pass's
own). The new claim is the new turn's; the old turn's lease stays lapsed, so that turn
reads nothing more. Kept per user, the new claim's bound let the old turn read on under
the new lease (two turns of one user in one lease), and the old turn's end (`forget`)
dropped the new turn's bound, leaving it half read and due for another instance at once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, TypeAlias

from lta_worker.domain import UserRow

# The pass renews its leases this many times per lease: a renewal that fails or stalls
# once still leaves two thirds of the lease to notice.
RENEWALS_PER_LEASE: Final = 3

# A lease of one claim: the user's id and the generation the claim gave it (its fencing
# token, `storage._leases`).
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
    """A renewal in flight: the users it covers (claimed before it started) and the expiry
    it writes."""

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
        """`renewal` returned successfully at `now`, the owner holding `held` after it:
        raise the leases it reached in time; a lease it covered that is not held any more
        was ended by another (`users drop` took the user) and is read under no more."""
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
