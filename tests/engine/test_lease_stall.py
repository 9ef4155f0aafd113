"""A database stalling longer than a lease: no read once the lease may have lapsed, and every
user given up stays due. The real Worker and the simulator on one virtual clock."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest

from lta_worker.storage import Store
from support.virtual_time import autojump, stall

from .conftest import ON_BOTH_BACKENDS, Harness

pytestmark = [pytest.mark.anyio, ON_BOTH_BACKENDS]

USERS = 20
LEASE_S = 10
MARGIN_S = 2  # service.request_timeout: a read sent must end within the lease
STALL_S = 15
# Twenty reads a minute: a turn that passed its lease check before the stall can still
# be waiting for its permit when the pass claims its user again after the stall.
BUDGET = 20


def stall_first_renewal(monkeypatch: pytest.MonkeyPatch, renewals: list[str]) -> None:
    """The first `renew_leases` stalls STALL_S virtual seconds: it lands after its leases lapsed."""
    original: Callable[..., Any] = Store.renew_leases

    def renew(self: Store, *args: Any, **kwargs: Any) -> Any:
        renewals.append("renew")
        if len(renewals) == 1:
            stall(STALL_S)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Store, "renew_leases", renew)


@pytest.mark.timeout(60)
async def test_no_read_is_sent_once_the_lease_may_have_lapsed(
    virtual_harness: Harness, monkeypatch: pytest.MonkeyPatch, log_stream: io.StringIO
) -> None:
    """Renewal stalled past the lease: no read after its end less request_timeout; rest stay due."""
    h = virtual_harness
    h.configure("poll", lease_duration=f"{LEASE_S}s", batch_size=100, concurrency=4)
    h.configure("service", request_timeout=f"{MARGIN_S}s")
    # About one read a second: the 40 reads of the pass need far longer than one lease.
    h.sim.configure(budget=60, window=60)
    renewals: list[str] = []
    async with autojump():
        for n in range(USERS):
            await h.enroll(f"user-{n:02d}")
        before = {f"user-{n:02d}": h.user(f"user-{n:02d}") for n in range(USERS)}
        h.sim.clear_requests()
        stall_first_renewal(monkeypatch, renewals)
        claimed_at = h.clock.now()  # virtual time stands still until the pass's first wait
        result = await h.run_pass()
    assert renewals  # the renewal stalled (and landed late)
    assert (result.stopped, result.exit_code) == ("completed", 0)
    reads = h.reads()
    assert reads  # the pass read while its leases were certainly held
    lapse = claimed_at + timedelta(seconds=LEASE_S - MARGIN_S)
    late = [(e.user, (e.at - claimed_at).total_seconds()) for e in reads if e.at >= lapse]
    assert late == []
    read_users = {e.user for e in reads}
    assert len(read_users) < USERS  # some users were given up
    for user, old in before.items():
        row = h.user(user)
        if user not in read_users:
            assert (row.next_due_at, row.last_polled_at) == (old.next_due_at, old.last_polled_at)
        assert row.next_due_at is not None
    with h.store() as store:
        due = store.count_due(h.clock.now())
    assert due >= USERS - len(read_users)
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    lapsed = [line for line in lines if line.get("event") == "pass.lease_lapsed"]
    assert len(lapsed) == 1  # once per pass, with the turns given up
    assert lapsed[0]["level"] == "warning"
    assert lapsed[0]["users"] >= USERS - len(read_users)


def stall_the_database(monkeypatch: pytest.MonkeyPatch, h: Harness, seconds: float) -> None:
    """From the first renewal on, every store call waits until `seconds` after it (as B6)."""
    until: list[datetime] = []

    def stalled(name: str) -> None:
        original: Callable[..., Any] = getattr(Store, name)

        def call(self: Store, *args: Any, **kwargs: Any) -> Any:
            now = anyio.from_thread.run_sync(h.clock.now)  # store calls run on a thread
            if name == "renew_leases" and not until:
                until.append(now + timedelta(seconds=seconds))
            if until and now < until[0]:
                stall((until[0] - now).total_seconds())
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Store, name, call)

    for name in ("renew_leases", "claim_due", "apply"):
        stalled(name)


def record_claims(monkeypatch: pytest.MonkeyPatch, h: Harness) -> dict[str, list[datetime]]:
    """When each user was claimed (virtual time at the claim's return)."""
    claims: dict[str, list[datetime]] = defaultdict(list)
    original: Callable[..., Any] = Store.claim_due

    def claim(self: Store, *args: Any, **kwargs: Any) -> Any:
        rows = original(self, *args, **kwargs)
        now = anyio.from_thread.run_sync(h.clock.now)
        for row in rows:
            claims[row.user].append(now)
        return rows

    monkeypatch.setattr(Store, "claim_due", claim)
    return claims


@pytest.mark.timeout(60)
async def test_a_turn_reads_nothing_under_its_users_next_claim(
    virtual_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a stall, a user's reads after its last claim are that claim's one turn (issue 28)."""
    h = virtual_harness
    h.configure("poll", lease_duration=f"{LEASE_S}s", batch_size=1, concurrency=4)
    h.configure("service", request_timeout=f"{MARGIN_S}s")
    h.sim.configure(budget=BUDGET, window=60)  # turns wait long for permits
    async with autojump():
        for n in range(USERS):
            await h.enroll(f"user-{n:02d}")
        h.sim.clear_requests()
        claims = record_claims(monkeypatch, h)
        stall_the_database(monkeypatch, h, STALL_S)
        await h.run_pass()
    again = [user for user, times in claims.items() if len(times) > 1]
    assert again  # the mechanism happened: users claimed again after their lease lapsed
    for user in again:
        after = [e.path.rsplit("/", 1)[1] for e in h.reads(user) if e.at >= claims[user][-1]]
        assert after in (["latest-change", "stats"], ["latest-change"], []), (user, after)


@pytest.mark.timeout(60)
async def test_the_leases_a_dead_instance_left_are_taken_back_naming_it(
    virtual_harness: Harness, log_stream: io.StringIO
) -> None:
    """A killed instance's leases: freed at start on SQLite (the lock proves it dead), taken
    once lapsed on PostgreSQL; `instance.lease_expired` names it once, and its users are read."""
    h = virtual_harness
    h.configure("poll", lease_duration=f"{LEASE_S}s")
    async with autojump():
        for n in range(3):
            await h.enroll(f"user-{n}")
        with h.store() as store:
            now = h.clock.now()
            lease_until = now + timedelta(seconds=LEASE_S)
            held = store.claim_due(
                now=now, due_before=now, limit=10, owner="dead", lease_until=lease_until
            )
        assert len(held) == 3  # ...and then it is killed: no release
        await anyio.sleep(LEASE_S + 1)
        result = await h.run_pass()
    assert (result.users, result.counts["ok"]) == (3, 6)
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    expired = [(e["instance"], e["users"]) for e in lines if e["event"] == "instance.lease_expired"]
    assert expired == [("dead", 3)]
