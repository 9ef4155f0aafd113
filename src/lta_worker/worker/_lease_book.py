"""Until when a pass certainly holds each claimed user's lease (pure: no I/O, takes times).

A lease in the database ends at the expiry last written for it. The pass knows a lower
bound of that: a claim's `lease_until` (computed before the claim call, so the claim wrote
it or a later one). A renewal raises the bound to its own expiry only when it is known to
have reached the row while the lease was still held: it started after the user's claim had
returned, and it returned before the bound it raises (a renewal that lands after the lease
lapsed may find the user claimed by another instance meanwhile; the time it was stalled is
never counted as held). A read is sent only while `now + margin` is before the bound, so it
ends within the lease: no other instance can claim the user and read it too.

The margin is `service.request_timeout`, the longest a read takes, but at most a
renewal period: a lease shorter than the timeout (against the advice of docs/config.md)
still leaves a healthy pass room to read, each read bounded by the renewal that follows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

# The pass renews its leases this many times per lease: a renewal that fails or stalls
# once still leaves two thirds of the lease to notice.
RENEWALS_PER_LEASE: Final = 3


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

    users: frozenset[int]
    lease_until: datetime


class LeaseBook:
    """Per claimed user, the time until which its lease is certainly held."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[int, datetime] = {}

    def claimed(self, users: Iterable[int], lease_until: datetime) -> None:
        """Users a claim returned, with the expiry computed before the claim call."""
        for user in users:
            self._until[user] = lease_until

    def renewing(self, lease_until: datetime) -> Renewal:
        """A renewal about to be sent, writing `lease_until`: it covers the users held now."""
        return Renewal(frozenset(self._until), lease_until)

    def renewed(self, renewal: Renewal, now: datetime) -> None:
        """`renewal` returned successfully at `now`: raise the users it reached in time."""
        for user in renewal.users:
            until = self._until.get(user)
            if until is not None and now < until < renewal.lease_until:
                self._until[user] = renewal.lease_until

    def forget(self, user: int) -> None:
        """The user's turn is written or given up: the pass no longer reads it."""
        self._until.pop(user, None)

    def may_read(self, user: int, now: datetime, margin: timedelta) -> bool:
        """Whether a read sent now ends (within `margin`) before the user's lease may lapse."""
        until = self._until.get(user)
        return until is not None and now + margin < until
