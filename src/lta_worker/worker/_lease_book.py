"""Until when a pass certainly holds each claimed user's lease (pure: no I/O, takes times).

A lease in the database ends at the expiry last written for it. The pass knows a lower
bound of that: a claim's `lease_until` (computed before the claim call, so the claim wrote
it or a later one). A renewal raises the bound to its own expiry only when it is known to
have reached the row while the lease was still held: it started after the user's claim had
returned, and it returned before the bound it raises (a renewal that lands after the lease
lapsed may find the user claimed by another instance meanwhile; the time it was stalled is
never counted as held). A read is sent only while `now + margin` is before the bound, so it
ends within the lease: no other instance can claim the user and read it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta


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
