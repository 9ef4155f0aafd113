"""The lease book: until when a pass certainly holds a claimed user's lease, so that it
never sends a read that may end after the lease lapsed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lta_worker.worker._pass import LeaseBook, read_margin

T0 = datetime(2025, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=10)
MARGIN = timedelta(seconds=2)
# A lease of the book: (user id, generation). ONE is the user's first claim, AGAIN its next.
ONE = (1, 1)
AGAIN = (1, 2)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# (what happens, when the read would be sent (s), whether it may be): the user is claimed
# at 0 with a lease to 10; a renewal started at `renew_start` writes `renew_start + 10` and
# returns at `renew_end` (None: no renewal); `claim_late` claims the user only after the
# renewal started.
CASES = [
    ("claim alone, well inside", None, None, False, 7.9, True),
    ("claim alone, within the margin of its end", None, None, False, 8.0, False),
    ("claim alone, after its end", None, None, False, 12.0, False),
    ("renewal in time raises the bound", 3.0, 3.5, False, 10.9, True),
    ("renewal in time, its own end less the margin", 3.0, 3.5, False, 11.0, False),
    ("renewal in flight counts for nothing yet", 3.0, None, False, 8.5, False),
    ("renewal landing after the lease lapsed", 3.0, 18.0, False, 18.5, False),
    ("renewal landing exactly at the lease's end", 3.0, 10.0, False, 10.5, False),
    ("renewal started before the claim returned", 3.0, 3.5, True, 10.9, False),
]


@pytest.mark.parametrize(
    ("renew_start", "renew_end", "claim_late", "read_at", "may"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_a_read_is_sent_only_while_the_lease_is_certainly_held(
    renew_start: float | None,
    renew_end: float | None,
    claim_late: bool,
    read_at: float,
    may: bool,
) -> None:
    """A read may be sent only while `now + margin` is before the last bound known held."""
    book = LeaseBook()
    if not claim_late:
        book.claimed([ONE], at(0) + LEASE)
    if renew_start is not None:
        renewal = book.renewing(at(renew_start) + LEASE)
        if claim_late:
            book.claimed([ONE], at(0) + LEASE)  # its claim computed the expiry at 0
        if renew_end is not None:
            book.renewed(renewal, at(renew_end), held={ONE})
    assert book.may_read(ONE, at(read_at), MARGIN) is may


def test_a_renewal_never_lowers_a_later_claim() -> None:
    """A user claimed again (a later expiry) keeps it when an older renewal returns."""
    book = LeaseBook()
    book.claimed([ONE], at(0) + LEASE)
    renewal = book.renewing(at(1) + LEASE)
    book.claimed([ONE], at(5) + LEASE)
    book.renewed(renewal, at(6), held={ONE})
    assert book.may_read(ONE, at(12.9), MARGIN)


def test_users_not_claimed_or_forgotten_are_never_read() -> None:
    """No claim known, or the turn done: no read."""
    book = LeaseBook()
    assert not book.may_read(ONE, at(0), MARGIN)
    book.claimed([ONE, (2, 1)], at(0) + LEASE)
    book.forget(ONE)
    assert not book.may_read(ONE, at(1), MARGIN)
    assert book.may_read((2, 1), at(1), MARGIN)


@pytest.mark.parametrize(
    ("lease_s", "timeout_s", "margin_s"),
    [(300, 60, 60), (10, 2, 2), (10, 60, 10 / 3), (1, 60, 1 / 3)],
)
def test_the_margin_is_the_request_timeout_at_most_a_renewal_period(
    lease_s: float, timeout_s: float, margin_s: float
) -> None:
    """The margin is `service.request_timeout`, but never more than a renewal period."""
    margin = read_margin(timedelta(seconds=lease_s), timedelta(seconds=timeout_s))
    assert margin == timedelta(seconds=margin_s)


def test_a_turn_of_a_lapsed_claim_never_reads_under_the_next_claim() -> None:
    """A lapsed claim's turn never reads under the next claim, nor ends its lease (issue 28)."""
    book = LeaseBook()
    book.claimed([ONE], at(0) + LEASE)
    book.claimed([AGAIN], at(15) + LEASE)  # after a stall: ONE lapsed at 10
    assert not book.may_read(ONE, at(16), MARGIN)
    assert book.may_read(AGAIN, at(16), MARGIN)
    book.forget(ONE)  # the old turn given up, its decision discarded
    assert book.may_read(AGAIN, at(16), MARGIN)


def test_a_lease_a_renewal_did_not_find_held_is_never_read_under_again() -> None:
    """Once a renewal returns without the lease, the turn reads no more (issue 28)."""
    book = LeaseBook()
    book.claimed([ONE, (2, 1)], at(0) + LEASE)
    renewal = book.renewing(at(3) + LEASE)
    book.renewed(renewal, at(3.5), held={(2, 1), (1, 7)})  # ONE's user: another's lease
    assert not book.may_read(ONE, at(4), MARGIN)
    assert book.may_read((2, 1), at(10.9), MARGIN)
